// Command poison sends a few hostile frames over a websocket of a running
// stack at a fixed interval, for tools/bench/soak.sh (SOAK_POISON=1): a body
// with a NUL, a lone surrogate escape, raw invalid UTF-8, bad JSON, a body
// over the body limit and a frame over the frame limit. Every frame's
// answer (or the close it caused) is written as a TSV line to -out, so a
// soak shows how the stack treated each kind and that it kept serving.
//
//	go run ./tools/bench/poison -endpoints d/endpoints.json -data-dir d -every 60s -out poison.tsv
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/chatpipe/chatpipe/internal/auth"
)

func main() {
	epPath := flag.String("endpoints", "chatpipe-data/endpoints.json", "endpoints.json of the stack (its websocket is used)")
	dataDir := flag.String("data-dir", "", "data dir holding the JWT secret (default: the endpoints file's dir)")
	secret := flag.String("jwt-secret", "", "JWT secret (default: CHATPIPE_JWT_SECRET, else the file in -data-dir)")
	every := flag.Duration("every", time.Minute, "interval between rounds")
	duration := flag.Duration("duration", 0, "stop after this long (0: run until SIGTERM/SIGINT)")
	user := flag.String("user", "soak-poison", "user the frames are sent as (its conversation is USER.c)")
	out := flag.String("out", "", "TSV of every frame's answer (default: stdout)")
	flag.Parse()

	ws, dir, err := readEndpoints(*epPath)
	if err != nil {
		log.Fatal(err)
	}
	if *dataDir != "" {
		dir = *dataDir
	}
	key, err := auth.LoadSecret(*secret, dir, false)
	if err != nil {
		log.Fatal(err)
	}
	w := io.Writer(os.Stdout)
	if *out != "" {
		f, err := os.OpenFile(*out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		w = f
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	fmt.Fprintln(w, "time\tround\tframe\tanswer")
	p := &poisoner{ws: ws, key: key, user: *user, conv: *user + ".c", w: w}
	for round := 1; ctx.Err() == nil; round++ {
		p.round(ctx, round)
		t := time.NewTimer(*every)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func readEndpoints(path string) (ws, dir string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	var ep struct {
		WebSocket string `json:"websocket"`
	}
	if err := json.Unmarshal(b, &ep); err != nil {
		return "", "", fmt.Errorf("%s: %w", path, err)
	}
	if ep.WebSocket == "" {
		return "", "", fmt.Errorf("%s: no websocket", path)
	}
	i := strings.LastIndexByte(path, '/')
	dir = "."
	if i >= 0 {
		dir = path[:i]
	}
	return ep.WebSocket, dir, nil
}

type poisoner struct {
	ws, user, conv string
	key            []byte
	w              io.Writer
	created        bool
}

// frame is one hostile frame; raw frames are sent as they are.
type frame struct {
	name string
	data func(round int) []byte
}

func sendFrame(id, cmid, bodyJSON string) []byte {
	return []byte(`{"id":"` + id + `","op":"send","conversation_id":"CONV","client_message_id":"` + cmid + `","body":` + bodyJSON + `}`)
}

var frames = []frame{
	{"nul-in-body", func(n int) []byte { return sendFrame("p1", fmt.Sprintf("nul-%d", n), `"before\u0000after"`) }},
	{"lone-surrogate", func(n int) []byte { return sendFrame("p2", fmt.Sprintf("sur-%d", n), `"x\ud800y"`) }},
	{"bad-json", func(int) []byte { return []byte(`{"id":"p3","op":"send","conversation_id":`) }},
	{"body-over-limit", func(n int) []byte {
		return sendFrame("p4", fmt.Sprintf("big-%d", n), `"`+strings.Repeat("b", 4097)+`"`)
	}},
	{"invalid-utf8", func(n int) []byte { return sendFrame("p5", fmt.Sprintf("utf-%d", n), "\"\xff\xfe\"") }},
	{"frame-over-limit", func(n int) []byte {
		return sendFrame("p6", fmt.Sprintf("huge-%d", n), `"`+strings.Repeat("h", 70<<10)+`"`)
	}},
}

func (p *poisoner) log(round int, name, answer string) {
	fmt.Fprintf(p.w, "%s\t%d\t%s\t%s\n", time.Now().UTC().Format(time.RFC3339), round, name, answer)
}

func (p *poisoner) dial(ctx context.Context) (*websocket.Conn, error) {
	tok, err := auth.Mint(p.key, p.user, time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, p.ws+"?token="+tok, nil)
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(1 << 20)
	return c, nil
}

// round sends every frame once; a frame that closes the connection (the
// server's answer to some of them) is followed by a new connection.
func (p *poisoner) round(ctx context.Context, round int) {
	var c *websocket.Conn
	defer func() {
		if c != nil {
			c.Close(websocket.StatusNormalClosure, "done")
		}
	}()
	if !p.created {
		var err error
		if c, err = p.dial(ctx); err != nil {
			p.log(round, "dial", "error: "+err.Error())
			return
		}
		create := []byte(`{"id":"p0","op":"create","conversation_id":"` + p.conv + `","members":[]}`)
		a := p.exchange(ctx, c, create)
		p.log(round, "create", a)
		if strings.HasPrefix(a, "accepted") || strings.Contains(a, "conflict") {
			p.created = true
		}
	}
	for _, f := range frames {
		if ctx.Err() != nil {
			return
		}
		if c == nil {
			var err error
			if c, err = p.dial(ctx); err != nil {
				p.log(round, f.name, "dial error: "+err.Error())
				continue
			}
		}
		data := []byte(strings.Replace(string(f.data(round)), "CONV", p.conv, 1))
		a := p.exchange(ctx, c, data)
		p.log(round, f.name, a)
		if strings.HasPrefix(a, "closed") || strings.HasPrefix(a, "error") {
			c.CloseNow()
			c = nil
		}
	}
}

// exchange writes data as a text frame and returns the answer: "OP CODE
// MESSAGE" of the first non-event frame, or how the connection ended.
func (p *poisoner) exchange(ctx context.Context, c *websocket.Conn, data []byte) string {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Write(wctx, websocket.MessageText, data); err != nil {
		return "error: write: " + err.Error()
	}
	for {
		_, b, err := c.Read(wctx)
		if err != nil {
			if s := websocket.CloseStatus(err); s != -1 {
				return fmt.Sprintf("closed %d", int(s))
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return "error: no answer in 10s"
			}
			return "error: read: " + err.Error()
		}
		var m struct {
			Op, Code, Message string
			Seq               int64
		}
		if json.Unmarshal(b, &m) != nil {
			return "error: unreadable answer"
		}
		if m.Op == "event" {
			continue
		}
		switch m.Op {
		case "accepted":
			return fmt.Sprintf("accepted seq %d", m.Seq)
		default:
			return strings.TrimSpace(m.Op + " " + m.Code + " " + m.Message)
		}
	}
}
