package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// probeURL succeeds on 2xx only, and gives up after its timeout.
func TestProbe(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.Write([]byte("ready\n"))
		case "/created":
			w.WriteHeader(http.StatusCreated)
		case "/slow":
			<-release
		default:
			http.Error(w, "no live worker owns a vshard", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	defer close(release)
	ctx := context.Background()
	for _, path := range []string{"/readyz", "/created"} {
		if err := probeURL(ctx, srv.URL+path, time.Second); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
	if err := probeURL(ctx, srv.URL+"/down", time.Second); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "no live worker") {
		t.Errorf("503: %v, want an error with the status and the reason", err)
	}
	start := time.Now()
	if err := probeURL(ctx, srv.URL+"/slow", 100*time.Millisecond); err == nil || time.Since(start) > 2*time.Second {
		t.Errorf("slow: %v after %v, want a timeout after 100ms", err, time.Since(start))
	}
	runProbe := func(args ...string) error { return newCommandTree().run(ctx, append([]string{"probe"}, args...)) }
	if err := runProbe("--timeout", "1s", srv.URL+"/readyz"); err != nil {
		t.Errorf("chatpipe probe: %v", err)
	}
	if err := runProbe("127.0.0.1:1/readyz"); err == nil {
		t.Error("chatpipe probe without a scheme: no error")
	}
	if err := runProbe(); err == nil {
		t.Error("chatpipe probe without a URL: no error")
	}
}
