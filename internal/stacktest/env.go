package stacktest

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// EnvInt reads a test's knob from the environment variable name: def if
// it is empty; anything but a positive integer fails t.
func EnvInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// EnvDuration is EnvInt for a positive duration, such as 20s.
func EnvDuration(t testing.TB, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration", name, v)
	}
	return d
}
