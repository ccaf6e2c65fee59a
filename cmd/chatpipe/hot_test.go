package main

import (
	"strings"
	"testing"

	"github.com/chatpipe/chatpipe/shardworker"
)

// printHot's table names each row's vshard, rate and whether it is
// isolated or being released.
func TestPrintHot(t *testing.T) {
	v64, v9 := 64, 9
	rows := []shardworker.HotRow{
		{HotConversation: shardworker.HotConversation{Conversation: "a", VShard: 64, PerSecond: 300}, Isolated: true, Override: &v64},
		{HotConversation: shardworker.HotConversation{Conversation: "c", VShard: 9, PerSecond: 90}, Override: &v9},
		{HotConversation: shardworker.HotConversation{Conversation: "b", VShard: 5, PerSecond: 45}},
	}
	var out strings.Builder
	if err := printHot(&out, rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CONVERSATION  VSHARD  MSG/S  ISOLATED", "yes (vshard 64)", "releasing", "45.0", "no"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
