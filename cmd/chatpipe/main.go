// Command chatpipe is the chat message pipeline's single binary: every role
// (gateway, worker, persist, a dev Kafka broker) and the all-in-one `dev`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	t := newCommandTree()
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, rootUsage(t.root))
		os.Exit(2)
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		fmt.Print(rootUsage(t.root))
		return
	}
	if node, _ := t.find(os.Args[1:2]); node == t.root {
		fmt.Fprintf(os.Stderr, "chatpipe: unknown command %q\n\n%s", name, rootUsage(t.root))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := t.run(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "chatpipe %s: %v\n", name, err)
		os.Exit(1)
	}
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad --log-level %q", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("bad --log-format %q (text or json)", format)
}

// logFlags adds --log-level and --log-format to fs.
func logFlags(fs *flagSet) (level, format *string) {
	return fs.String("log-level", "info", "log level: debug, info, warn, error"),
		fs.String("log-format", "text", "log format: text or json")
}
