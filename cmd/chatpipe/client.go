package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chatpipe/chatpipe/client"
	"github.com/chatpipe/chatpipe/internal/auth"
	"github.com/chatpipe/chatpipe/protocol"
)

const clientHelp = `commands (one per line):
  create CONV [MEMBER...]   create a conversation with members
  join CONV USER            add USER to CONV
  kick CONV USER            remove USER from CONV (the owner)
  leave CONV                leave CONV
  send CONV BODY...         send the rest of the line as a message
  history CONV [N]          the last N events of CONV (default 20)
  sync                      catch up from the last sync's cursors
  convs                     your conversations, most recently active first, with unread counts
                            (and the read markers you just set)
  read CONV [SEQ]           mark CONV read up to SEQ (default: its last seq, asked of the
                            server when you have none of its events yet)
  wait DURATION             pause (e.g. 500ms), for scripts
  help                      this text
  quit                      exit (so does the end of the input)
events are printed as they arrive: [CONV #SEQ] ...
`

// newClientCommand makes chatpipe client.
func newClientCommand() *command {
	fs := newFlagSet("client")
	user := fs.String("user", "", "user id to connect as (the token's sub)")
	wsURL := fs.String("ws", "", "websocket URL of a gateway (default: the endpoints file's)")
	epPath := fs.String("endpoints", "chatpipe-data/endpoints.json", "endpoints.json of the stack (not read with --ws unless given)")
	token := fs.String("token", "", "a ready token (default: minted for --user with the secret)")
	secret := fs.String("jwt-secret", "", "JWT HS256 secret (default: CHATPIPE_JWT_SECRET, else --jwt-secret-file, else the file in --data-dir)")
	secretFile := fs.String("jwt-secret-file", "", "file holding the JWT HS256 secret")
	dataDir := fs.String("data-dir", "", "data dir of 'chatpipe dev' holding the generated secret (default: the endpoints file's dir)")
	batch := fs.Bool("batch", false, "ask for the chatpipe.v1.batch subprotocol")
	return newCommand(fs, "a line-oriented chat client for trying the protocol by hand (send, create, history, …)", func(ctx context.Context, _ []string) error {
		if *user == "" && *token == "" {
			return errors.New("--user is required")
		}
		epGiven := os.Getenv("CHATPIPE_ENDPOINTS") != ""
		fs.Visit(func(f *flag.Flag) { epGiven = epGiven || f.Name == "endpoints" })
		url := *wsURL
		dir := *dataDir
		if url == "" || epGiven {
			ep, err := readEndpoints(*epPath)
			if err != nil {
				return err
			}
			if url == "" {
				url = ep.WebSocket
			}
			if dir == "" {
				dir = filepath.Dir(*epPath)
			}
		}
		ts := client.StaticToken(*token)
		if *token == "" {
			key, err := clientSecret(*secret, *secretFile, dir)
			if err != nil {
				return err
			}
			u := *user
			ts = func(context.Context) (string, error) { return auth.Mint(key, u, 24*time.Hour, time.Now()) }
		}
		var outMu sync.Mutex
		out := os.Stdout
		printf := func(format string, a ...any) {
			outMu.Lock()
			defer outMu.Unlock()
			fmt.Fprintf(out, format, a...)
		}
		c, err := client.Dial(ctx, url, ts, client.Options{
			Batch:   *batch,
			OnEvent: func(e client.Event) { printf("%s\n", formatEvent(&e)) },
			OnRead:  func(conv string, seq int64) { printf("[%s] read up to #%d\n", conv, seq) },
		})
		if err != nil {
			return err
		}
		defer c.Close()
		printf("connected to %s as %s; 'help' lists the commands\n", url, *user)
		return clientLoop(ctx, c, os.Stdin, printf)
	}).withUsage("Usage: chatpipe client --user U [flags]\n\nReads commands from standard input.\n\n" + clientHelp + "\nFlags:\n")
}

// clientSecret finds the JWT secret as the other subcommands do
// (auth.FindSecret), in dir or else ./chatpipe-data.
func clientSecret(secret, secretFile, dir string) ([]byte, error) {
	if dir == "" {
		dir = "chatpipe-data"
	}
	dir, _ = filepath.Abs(dir)
	key, err := auth.FindSecret(auth.SecretSources{Value: secret, File: secretFile, DataDir: dir})
	if err != nil {
		return nil, fmt.Errorf("jwt secret: %w", err)
	}
	return key, nil
}

// clientLoop runs the commands read from in until it ends, quit or ctx
// ends. The line reader stops at the end of in; a read blocked on a
// terminal ends with the process.
func clientLoop(ctx context.Context, c *client.Client, in io.Reader, printf func(string, ...any)) error {
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 64<<10)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var line string
		select {
		case <-ctx.Done():
			return nil
		case l, ok := <-lines:
			if !ok {
				return nil
			}
			line = l
		}
		quit, err := clientCommand(ctx, c, line, printf)
		if err != nil {
			printf("error: %v\n", err)
		}
		if quit {
			return nil
		}
	}
}

// clientCommand runs one line.
func clientCommand(ctx context.Context, c *client.Client, line string, printf func(string, ...any)) (quit bool, err error) {
	fields := strings.Fields(line)
	if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
		return false, nil
	}
	need := func(n int, usage string) error {
		if len(fields) < n {
			return fmt.Errorf("usage: %s", usage)
		}
		return nil
	}
	accepted := func(what string, r *protocol.Reply, err error) error {
		if err != nil {
			return err
		}
		printf("accepted %s seq %d\n", what, r.Seq)
		return nil
	}
	switch fields[0] {
	case "quit", "exit":
		return true, nil
	case "help", "?":
		printf("%s", clientHelp)
	case "wait":
		if err := need(2, "wait DURATION"); err != nil {
			return false, err
		}
		d, err := time.ParseDuration(fields[1])
		if err != nil {
			return false, fmt.Errorf("wait: %w", err)
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	case "create":
		if err := need(2, "create CONV [MEMBER...]"); err != nil {
			return false, err
		}
		r, err := c.Create(ctx, fields[1], fields[2:]...)
		return false, accepted("create "+fields[1], r, err)
	case "join", "kick":
		if err := need(3, fields[0]+" CONV USER"); err != nil {
			return false, err
		}
		op := c.Join
		if fields[0] == "kick" {
			op = c.Kick
		}
		r, err := op(ctx, fields[1], fields[2])
		return false, accepted(fields[0]+" "+fields[2], r, err)
	case "leave":
		if err := need(2, "leave CONV"); err != nil {
			return false, err
		}
		r, err := c.Leave(ctx, fields[1])
		return false, accepted("leave "+fields[1], r, err)
	case "send":
		if err := need(3, "send CONV BODY..."); err != nil {
			return false, err
		}
		// The body is the rest of the line as typed, spaces included.
		rest := strings.TrimSpace(line)[len("send"):]
		rest = strings.TrimSpace(rest)[len(fields[1]):]
		r, err := c.Send(ctx, fields[1], strings.TrimSpace(rest))
		return false, accepted("send to "+fields[1], r, err)
	case "history":
		if err := need(2, "history CONV [N]"); err != nil {
			return false, err
		}
		n := 20
		if len(fields) > 2 {
			if n, err = strconv.Atoi(fields[2]); err != nil || n <= 0 {
				return false, fmt.Errorf("history: bad N %q", fields[2])
			}
		}
		evs, err := c.History(ctx, fields[1], 0, n)
		if err != nil {
			return false, err
		}
		for i := range evs {
			printf("%s\n", formatEvent(&evs[i]))
		}
		printf("history %s: %d events\n", fields[1], len(evs))
	case "sync":
		if err := c.Sync(ctx); err != nil {
			return false, err
		}
		printf("synced %v\n", c.Cursors())
	case "convs", "conversations":
		list, err := listConversations(ctx, c, readModelWait)
		if err != nil {
			return false, err
		}
		for _, x := range list {
			note := ""
			if x.stale {
				note = " (counted before that marker: the read model has yet to catch up)"
			}
			printf("%s last_seq %d at %s, read to %d, %d unread%s\n", x.ConversationID, x.LastSeq, x.LastActivityAt, x.ReadSeq, x.Unread, note)
		}
		printf("%d conversations\n", len(list))
	case "read":
		if err := need(2, "read CONV [SEQ]"); err != nil {
			return false, err
		}
		var seq int64
		if len(fields) > 2 {
			n, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil || n < 1 {
				return false, fmt.Errorf("read: bad SEQ %q", fields[2])
			}
			seq = n
		} else if seq, err = latestSeq(ctx, c, fields[1]); err != nil {
			return false, err
		}
		if err := c.MarkRead(ctx, fields[1], seq); err != nil {
			return false, err
		}
		printf("read %s up to %d\n", fields[1], c.ReadSeq(fields[1]))
	default:
		return false, fmt.Errorf("unknown command %q ('help' lists them)", fields[0])
	}
	return false, nil
}

// latestSeq is the last seq of conv as far as c knows: its newest event
// of conv, or its cursor of conv. Knowing neither (the sync at connect has
// not brought any yet, say), it asks the server for conv's newest event.
func latestSeq(ctx context.Context, c *client.Client, conv string) (int64, error) {
	seq := c.Cursors()[conv]
	if m := c.Messages(conv); len(m) > 0 && m[len(m)-1].Seq > seq {
		seq = m[len(m)-1].Seq
	}
	if seq > 0 {
		return seq, nil
	}
	evs, err := c.History(ctx, conv, 0, 1)
	if err != nil {
		return 0, fmt.Errorf("read: the last seq of %s: %w", conv, err)
	}
	if len(evs) == 0 {
		return 0, fmt.Errorf("read: %s has no events you may see", conv)
	}
	return evs[len(evs)-1].Seq, nil
}

// readModelWait is how long convs waits for the read model to show the
// read markers the client knows of, such as one it has just set.
const readModelWait = 3 * time.Second

// listedConv is a conversations entry as convs shows it.
type listedConv struct {
	protocol.ConversationInfo
	// stale is set when ReadSeq is a marker the client knows of but the
	// read model did not have yet: Unread was counted before it.
	stale bool
}

// listConversations lists the caller's conversations. A read marker
// is committed before the read model has it, so an entry may show an
// older marker than c knows of (one it has just set): it lists again
// until none does, for up to wait, then shows c's markers in place of
// the older ones (an unread count of 0 when the marker is at the last
// seq, else the count as listed, marked stale).
func listConversations(ctx context.Context, c *client.Client, wait time.Duration) ([]listedConv, error) {
	deadline := time.Now().Add(wait)
	for {
		list, err := c.ListConversations(ctx, 0)
		if err != nil {
			return nil, fmt.Errorf("convs: %w", err)
		}
		behind := false
		for _, x := range list {
			behind = behind || c.ReadSeq(x.ConversationID) > x.ReadSeq
		}
		if behind && time.Now().Before(deadline) {
			select {
			case <-time.After(100 * time.Millisecond):
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("convs: %w", ctx.Err())
			}
		}
		out := make([]listedConv, len(list))
		for i, x := range list {
			out[i].ConversationInfo = x
			if known := c.ReadSeq(x.ConversationID); known > x.ReadSeq {
				out[i].ReadSeq = known
				if known >= x.LastSeq {
					out[i].Unread = 0
				} else {
					out[i].stale = true
				}
			}
		}
		return out, nil
	}
}

// formatEvent is one event as a line: [CONV #SEQ] what happened.
func formatEvent(e *client.Event) string {
	head := fmt.Sprintf("[%s #%d] ", e.ConversationID, e.Seq)
	switch e.Kind {
	case "message":
		return head + e.Sender + ": " + e.Body
	case "create":
		return head + e.Sender + " created it with " + strings.Join(e.Members, ", ")
	case "join":
		return head + e.Sender + " added " + e.UserID
	case "kick":
		return head + e.Sender + " removed " + e.UserID
	case "leave":
		return head + e.UserID + " left"
	}
	return head + e.Kind
}
