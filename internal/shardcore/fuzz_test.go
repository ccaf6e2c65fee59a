package shardcore

import (
	"testing"
	"time"

	"github.com/chatpipe/chatpipe/protocol"
)

// FuzzDecide feeds arbitrary command sequences to Decide/Apply: it never
// panics, a write always takes LastSeq+1, nobody but a member ever gets a
// message written, and a retry of any command with a client_message_id
// that wrote returns its first seq and writes nothing; a read marker
// takes no seq and names one that exists.
func FuzzDecide(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{4, 4, 4, 0, 4, 2, 4, 3, 4})
	ops := []string{protocol.OpCreate, protocol.OpJoin, protocol.OpKick, protocol.OpLeave, protocol.OpSend, protocol.OpRead, "bogus"}
	users := []string{"a", "b", "c", "d"}
	f.Fuzz(func(t *testing.T, script []byte) {
		c := NewConv()
		first := map[string]int64{}
		for i := 0; i+1 < len(script); i += 2 {
			op, arg := script[i], script[i+1]
			cmd := Command{Op: ops[int(op)%len(ops)], ConversationID: "c", Sender: users[int(arg)%len(users)],
				UserID: users[int(arg>>2)%len(users)], ClientMessageID: string(rune('m' + arg%4)), Body: "x",
				Members: users[:int(arg>>4)%len(users)]}
			if cmd.Op != protocol.OpSend && arg&0x80 == 0 {
				cmd.ClientMessageID = "" // membership commands may come without a key
			}
			if cmd.Op == protocol.OpRead {
				cmd.ClientMessageID, cmd.Seq = "", int64(arg%8) // markers carry no key
			}
			_, wasMember := c.Members[cmd.Sender]
			d := Decide(c, &cmd, Stamp{Now: time.Unix(0, 0), MessageID: "id"}, Limits{MaxMembers: 3})
			if d.Event != nil && cmd.Op == protocol.OpRead {
				if d.Event.Seq != 0 || d.Event.ReadSeq < 1 || d.Event.ReadSeq > c.LastSeq || !wasMember {
					t.Fatalf("read marker %+v after seq %d (member %v)", d.Event, c.LastSeq, wasMember)
				}
				Apply(c, d.Event)
				continue
			}
			if d.Event != nil {
				if d.Event.Seq != c.LastSeq+1 {
					t.Fatalf("write took seq %d after %d", d.Event.Seq, c.LastSeq)
				}
				if cmd.Op == protocol.OpSend && !wasMember {
					t.Fatalf("message written for non-member %s", cmd.Sender)
				}
				Apply(c, d.Event)
			}
			if cmd.ClientMessageID != "" && d.Reject == nil {
				f, ok := first[cmd.ClientMessageID]
				switch {
				case ok && d.Event != nil:
					t.Fatalf("retry of %s %s wrote seq %d; its first result was seq %d", cmd.Op, cmd.ClientMessageID, d.Event.Seq, f)
				case ok && d.Seq != f:
					t.Fatalf("retry of %s %s got seq %d, first %d", cmd.Op, cmd.ClientMessageID, d.Seq, f)
				case d.Event != nil:
					first[cmd.ClientMessageID] = d.Event.Seq
				}
			}
		}
	})
}
