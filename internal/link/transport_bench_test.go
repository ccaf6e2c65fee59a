package link

import (
	"context"
	"encoding/json"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/chatpipe/chatpipe/protocol"
)

// The link's transport, measured against gRPC: the same request and answer,
// encoded the same way (JSON), many calls in flight at once, as a gateway
// makes them. The figure is docs/operations.md's reason for keeping this
// link over a gRPC one:
//
//	go test ./internal/link -run '^$' -bench LinkRoundTrip -benchmem
func BenchmarkLinkRoundTrip(b *testing.B) {
	req := &protocol.Request{Op: protocol.OpSend, ID: "r12345", ConversationID: "g-000123", ClientMessageID: "u-000042-000000001234",
		Body: "hello there, this is a message of a typical length for a chat app"}
	answer := func(r *Request) *Response {
		return &Response{RID: r.RID, Reply: &protocol.Reply{Op: protocol.OpAccepted, ID: r.Req.ID, ConversationID: r.Req.ConversationID,
			Seq: 4711, MessageID: "01KQ8Z3V9T4B6N2M5X7C1D0F8G", ClientMessageID: r.Req.ClientMessageID}}
	}
	b.Run("wire", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			Serve(ctx, ln, func(r *Request, reply func(*Response)) { reply(answer(r)) }, Config{}, quiet())
		}()
		defer func() { cancel(); <-done }()
		cl, err := Dial(context.Background(), ln.Addr().String(), Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		b.ReportAllocs()
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := cl.Do(context.Background(), "u-000042", req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("grpc", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := grpc.NewServer(grpc.ForceServerCodec(jsonCodec{}))
		srv.RegisterService(&grpc.ServiceDesc{ServiceName: "chatpipe.Link", HandlerType: (*any)(nil),
			Methods: []grpc.MethodDesc{{MethodName: "Do", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				var r Request
				if err := dec(&r); err != nil {
					return nil, err
				}
				return answer(&r), nil
			}}}}, struct{}{})
		go srv.Serve(ln)
		defer srv.Stop()
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(jsonCodec{})))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		b.ReportAllocs()
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				var resp Response
				if err := conn.Invoke(context.Background(), "/chatpipe.Link/Do", &Request{User: "u-000042", Req: req}, &resp); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// jsonCodec is gRPC's codec for the link's own JSON messages.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)   { return json.Marshal(v) }
func (jsonCodec) Unmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
func (jsonCodec) Name() string                    { return "json" }
