package stacktest

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/chatpipe/chatpipe/internal/devstack"
	"github.com/chatpipe/chatpipe/internal/promtext"
)

// WaitFor polls cond until it holds or the timeout passes, which fails t
// naming what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	WaitForOr(t, timeout, what, cond, nil)
}

// WaitForOr is WaitFor whose failure also prints detail(), what the test
// knows about why cond does not hold.
func WaitForOr(t testing.TB, timeout time.Duration, what string, cond func() bool, detail func() string) {
	t.Helper()
	defer Watch(t).Waiting(what)()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			if detail != nil {
				t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, detail())
			}
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Metric sums a Prometheus metric over its label sets; a name may
// carry a selector, `name{k="v",...}`, to sum only the sets that match.
func Metric(t testing.TB, url, name string) float64 {
	t.Helper()
	if base, sel, ok := strings.Cut(name, "{"); ok {
		labels := strings.Split(strings.TrimSuffix(sel, "}"), ",")
		return MetricLabeled(t, url, base, labels...)
	}
	return MetricLabeled(t, url, name)
}

// MetricLabeled sums a Prometheus metric (a counter, gauge or untyped
// one) over the label sets that have every one of labels (each
// `name="value"`).
func MetricLabeled(t testing.TB, url, name string, labels ...string) float64 {
	t.Helper()
	return promtext.Sum(Scrape(t, url), name, labels...)
}

// Scrape reads the /metrics page at url: its metric families by name.
func Scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("metrics %s: %v", url, err)
	}
	defer resp.Body.Close()
	fams, err := promtext.Parse(resp.Body)
	if err != nil {
		t.Fatalf("metrics %s: %v", url, err)
	}
	return fams
}

// FreePort returns a port on 127.0.0.1 for a process a test starts (a
// worker's --listen, an etcd member, an admin address): devstack.FreePort's,
// below the kernel's ephemeral range, each call the next one there.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Dialable says whether something accepts TCP connections on port of
// 127.0.0.1.
func Dialable(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
