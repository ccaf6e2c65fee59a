package client_test

import (
	"context"
	"fmt"
	"log"

	"github.com/chatpipe/chatpipe/client"
)

// A device of alice: it creates a conversation, sends to it and prints
// the events as they arrive, each once, whatever reconnects happen.
func Example() {
	ctx := context.Background()
	tok := "…" // an HS256 JWT whose sub is alice (chatpipe token --user alice)
	c, err := client.Dial(ctx, "ws://127.0.0.1:8080/v1/ws", client.StaticToken(tok), client.Options{
		OnEvent: func(e client.Event) { fmt.Printf("[%s #%d] %s: %s\n", e.ConversationID, e.Seq, e.Sender, e.Body) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Create(ctx, "c1", "bob"); err != nil {
		log.Fatal(err)
	}
	r, err := c.Send(ctx, "c1", "hi")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored at seq", r.Seq)
	for _, e := range c.Messages("c1") { // ordered by seq, no duplicates
		fmt.Println(e.Seq, e.Kind)
	}
}
