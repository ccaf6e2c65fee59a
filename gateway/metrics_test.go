package gateway

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/chatpipe/chatpipe/internal/delivery"
	"github.com/chatpipe/chatpipe/logrecord"
	"github.com/chatpipe/chatpipe/protocol"
)

// gathered returns the series of family name in reg, by their labels
// ("code=,op=send,result=accepted"), with each series' value (a
// histogram's: its count) when it is not 0.
func gathered(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			key := ""
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			if v := value(m); v != 0 {
				out[key] = v
			}
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

// Every answered frame is counted once in chatpipe_gateway_commands_total
// by op, result and code, and its latency observed by op; vshards the
// owner view has no live worker for are in chatpipe_gateway_unowned_vshards.
func TestCommandMetrics(t *testing.T) {
	reads := &fakeReads{syncRes: &delivery.SyncResult{Cursors: map[string]int64{}}}
	g, srv := readGateway(t, reads, func(c *Config) { c.VShards = 4 })
	w := dialWS(t, srv, "u1")
	w.write(`{"op":"fly","id":"b1"}`)
	if f := w.read(); f.Code != "bad_request" {
		t.Fatalf("unknown op: %+v", f)
	}
	w.write(`{"op":"sync","id":"y1","cursors":{}}`)
	if f := w.read(); f.Op != protocol.OpSynced {
		t.Fatalf("sync: %+v", f)
	}
	conv := "c0"
	for i := 0; logrecord.VShard(conv, 4) != 0; i++ { // on vshard 0, the one owned
		conv = "c" + strconv.Itoa(i)
	}
	w.write(`{"op":"send","id":"s1","conversation_id":"` + conv + `","client_message_id":"m1","body":"hi"}`)
	if f := w.read(); f.Op != protocol.OpAccepted {
		t.Fatalf("send: %+v", f)
	}

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(g.Collectors()...)
	if got := gathered(t, reg, "chatpipe_gateway_unowned_vshards"); got[""] != 3 {
		t.Errorf("unowned_vshards %v, want 3 (of 4, one owned)", got)
	}
	// A frame is counted just after its answer is queued: wait for the last.
	key := func(op, result, code string) string { return "code=" + code + ",op=" + op + ",result=" + result }
	deadline := time.Now().Add(2 * time.Second)
	for len(gathered(t, reg, "chatpipe_gateway_command_seconds")) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	want := map[string]float64{
		key("invalid", "rejected", "bad_request"): 1,
		key("send", "accepted", ""):               1,
		key("sync", "accepted", ""):               1,
	}
	got := gathered(t, reg, "chatpipe_gateway_commands_total")
	if len(got) != len(want) {
		t.Errorf("commands_total %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("commands_total{%s} = %v, want %v", k, got[k], v)
		}
	}
	lat := gathered(t, reg, "chatpipe_gateway_command_seconds")
	for _, op := range []string{"invalid", "send", "sync"} {
		if lat["op="+op] != 1 {
			t.Errorf("command_seconds{op=%s} count %v, want 1 (all: %v)", op, lat["op="+op], lat)
		}
	}
}
