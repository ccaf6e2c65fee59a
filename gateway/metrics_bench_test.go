package gateway

import (
	"testing"
	"time"
)

// BenchmarkCountAccepted is what every accepted frame costs in metrics:
// its op label, the commands counter and the latency histogram.
func BenchmarkCountAccepted(b *testing.B) {
	g := fakeGateway(&testing.T{}, newFakeOwners(), newFakeNet(), nil)
	req := send("r1", "c1")
	start := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		op := g.opLabel(req)
		g.count(op, "")
		g.observe(op, start)
	}
}
