package main

import (
	"testing"
)

// Every role's registry has chatpipe_build_info 1 with the version and
// the Go version as labels.
func TestRegistryHasBuildInfo(t *testing.T) {
	fams, err := newRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "chatpipe_build_info" {
			continue
		}
		m := f.GetMetric()
		if len(m) != 1 || m[0].GetGauge().GetValue() != 1 {
			t.Fatalf("chatpipe_build_info: %v", m)
		}
		labels := map[string]string{}
		for _, l := range m[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if _, ok := labels["version"]; !ok || labels["go_version"] == "" {
			t.Fatalf("chatpipe_build_info labels %v, want version and go_version", labels)
		}
		return
	}
	t.Fatal("no chatpipe_build_info in the registry")
}
