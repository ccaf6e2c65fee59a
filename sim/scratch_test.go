package sim

import (
	"os"
	"strconv"
	"testing"
)

func TestScratch(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("N"))
	if n == 0 {
		n = 200
	}
	var tot Stats
	fails := map[string]int{}
	first := map[string]int{}
	for seed := 1; seed <= n; seed++ {
		cfg := DefaultConfig()
		switch os.Getenv("BUG") {
		case "a":
			cfg.Bugs.AcceptBeforeMarker = true
		case "b":
			cfg.Bugs.AcceptedBeforeCommit = true
		case "c":
			cfg.Bugs.MembershipOutsideMailbox = true
		}
		cfg.WhatIf.RecheckAtOpen = os.Getenv("FIX") != ""
		cfg.WhatIf.FenceCheckedAnswers = os.Getenv("FIX2") != ""
		cfg.StrictAnswers = os.Getenv("STRICT") != ""
		r := Run(cfg, NewSeededChooser(uint64(seed)))
		tot.add(r.Stats)
		for _, p := range r.Properties() {
			fails[p]++
			if _, ok := first[p]; !ok {
				first[p] = seed
				if os.Getenv("V") != "" {
					t.Logf("seed %d:\n%s", seed, r.Report(80))
				}
			}
		}
		if r.Stale != "" && os.Getenv("S") != "" {
			t.Logf("seed %d stale: %s", seed, r.Stale)
		}
	}
	t.Logf("fails %v first %v", fails, first)
	t.Logf("stats %+v", tot)
}
