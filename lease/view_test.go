package lease

import (
	"fmt"
	"testing"
)

// Overrides are read without the watcher's lock, from a copy made at each
// change: a change shows at once, and none means no lookup at all.
func TestWatcherOverride(t *testing.T) {
	w := StaticOverrides(View{}, map[string]Override{"hot": {VShard: 9}})
	if v, ok := w.Override("hot"); !ok || v != 9 {
		t.Fatalf("Override(hot) = %d, %v", v, ok)
	}
	if _, ok := w.Override("cold"); ok {
		t.Fatal("cold has no override")
	}
	w.mu.Lock()
	w.applyLocked(&w.view, routesPrefix(w.prefix)+"hot", nil, 2, true)
	w.applyLocked(&w.view, routesPrefix(w.prefix)+"warm", []byte(`{"vshard":8}`), 3, false)
	w.notifyLocked()
	w.mu.Unlock()
	if _, ok := w.Override("hot"); ok {
		t.Fatal("hot's override was deleted")
	}
	if v, ok := w.Override("warm"); !ok || v != 8 || len(w.Overrides()) != 1 {
		t.Fatalf("Override(warm) = %d, %v; overrides %v", v, ok, w.Overrides())
	}
}

// BenchmarkOverride is the per-command cost of routing by override: the
// gateway and the worker look one up for every write.
func BenchmarkOverride(b *testing.B) {
	for _, n := range []int{0, 16} {
		routes := map[string]Override{}
		for i := 0; i < n; i++ {
			routes[fmt.Sprintf("hot-%d", i)] = Override{VShard: 64 + i}
		}
		w := StaticOverrides(View{}, routes)
		b.Run(fmt.Sprintf("overrides=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				w.Override("some-conversation")
			}
		})
	}
}
