package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// newProbeCommand makes `chatpipe probe [--timeout D] URL`: a GET that
// succeeds on 2xx and fails (exit status 1, the status and first line of the
// body on stderr) on any other status, a connection error or the timeout.
func newProbeCommand() *command {
	fs := newFlagSet("probe")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long (connecting and reading the answer)")
	fs.check(positive("timeout"))
	return newCommand(fs, "GET a URL and exit 0 on a 2xx answer (container healthchecks: the image has no shell or HTTP client)", func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return errors.New("want one URL, e.g. chatpipe probe http://127.0.0.1:7074/readyz")
		}
		return probeURL(ctx, args[0], *timeout)
	}).withUsage("Usage: chatpipe probe [--timeout D] URL   (e.g. http://127.0.0.1:7074/readyz)\n")
}

// probeURL GETs url within timeout; nil on a 2xx answer.
func probeURL(ctx context.Context, url string, timeout time.Duration) error {
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return fmt.Errorf("%q: want an http:// or https:// URL", url)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	line, _ := bufio.NewReader(io.LimitReader(resp.Body, 512)).ReadString('\n')
	if line = strings.TrimSpace(line); line != "" {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, line)
	}
	return fmt.Errorf("GET %s: %s", url, resp.Status)
}
