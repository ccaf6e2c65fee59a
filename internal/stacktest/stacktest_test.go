package stacktest

import "testing"

func TestQuickRaceExit(t *testing.T) {
	for in, want := range map[string]string{
		"":                                  "atexit_sleep_ms=0",
		"halt_on_error=1":                   "halt_on_error=1 atexit_sleep_ms=0",
		"atexit_sleep_ms=250":               "atexit_sleep_ms=250",
		"log_path=/tmp/r atexit_sleep_ms=5": "log_path=/tmp/r atexit_sleep_ms=5",
	} {
		if got := QuickRaceExit(in); got != want {
			t.Errorf("QuickRaceExit(%q) = %q, want %q", in, got, want)
		}
	}
}
