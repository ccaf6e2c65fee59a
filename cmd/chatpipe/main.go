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
	"sort"
	"strings"
	"syscall"
)

const usage = `chatpipe — a chat message pipeline with one server order per conversation.

Usage: chatpipe <command> [flags]

Commands:
  dev       run everything in one process on embedded defaults (etcd, Kafka, Postgres)
  gateway   serve the websocket protocol and route commands to workers
  worker    own virtual shards and write their conversations to Kafka
  persist   copy the committed log into Postgres
  kafka     run a standalone dev Kafka broker (kfake) with a data dir
  etcd      run one member of a static etcd cluster on 127.0.0.1 (fault tests, multi-process setups)
  token     print a client token for a user
  init      prepare a deployment once: its shape in etcd, the Postgres schema, the topic
  version   print the version
  admin     operator commands: shards, handoff, check-config, rebuild
  export    write one day's committed events to chunk files, crash-safe and resumable
%s
Every flag can also be set with CHATPIPE_<FLAG> (upper case, '-' as '_') or in
a config file (--config FILE or CHATPIPE_CONFIG: name = value lines); a flag
wins over its variable, a variable over the file. A CHATPIPE_ variable or a
config key that is a flag of no command, or a value out of range, is an error.
Run 'chatpipe <command> -h' for its flags and defaults.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usageText())
		os.Exit(2)
	}
	cmds := commandTable()
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		fmt.Print(usageText())
		return
	}
	fn, ok := cmds[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "chatpipe: unknown command %q\n\n%s", name, usageText())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := fn(ctx, os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "chatpipe %s: %v\n", name, err)
		os.Exit(1)
	}
}

// commandTable maps every subcommand's name to its function.
func commandTable() map[string]func(ctx context.Context, args []string) error {
	cmds := map[string]func(ctx context.Context, args []string) error{
		"dev": runDev, "gateway": runGateway, "worker": runWorker, "persist": runPersist,
		"kafka": runKafka, "token": runToken, "etcd": runEtcd, "init": runInit, "version": runVersion, "admin": runAdmin, "export": runExport,
	}
	for _, c := range extraCommands {
		cmds[c.name] = c.run
	}
	return cmds
}

// extraCommand is a subcommand registered from its own file (see register).
type extraCommand struct {
	name, summary string
	run           func(ctx context.Context, args []string) error
}

var extraCommands []extraCommand

// register adds a subcommand; files call it from init so each command
// lives in one file.
func register(name, summary string, run func(ctx context.Context, args []string) error) {
	extraCommands = append(extraCommands, extraCommand{name, summary, run})
}

func usageText() string {
	sort.Slice(extraCommands, func(i, j int) bool { return extraCommands[i].name < extraCommands[j].name })
	var b strings.Builder
	for _, c := range extraCommands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	return fmt.Sprintf(usage, b.String())
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

func logFlags(fs *flag.FlagSet) (level, format *string) {
	return fs.String("log-level", "info", "log level: debug, info, warn, error"),
		fs.String("log-format", "text", "log format: text or json")
}
