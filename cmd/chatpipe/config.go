package main

// Configuration: every command's flags come from three sources, in this
// order of precedence: the command line, CHATPIPE_<FLAG> environment
// variables, and a config file (--config FILE or CHATPIPE_CONFIG). A
// command's parse (commands.go) applies them with ffcli and ff, and fails
// loudly on what cannot work: an environment variable or config key that no
// chatpipe command reads (checkEnv, parseConfigFile), a value not of its
// flag's type (checkSyntax) and a value out of its flag's range (the
// flagChecks below). docs/operations.md ("Configuration") states the rules.

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// envPrefix starts every environment variable chatpipe reads.
const envPrefix = "CHATPIPE_"

// otherEnv are CHATPIPE_* variables that are not flags: read by the tests,
// the fault points of a chatpipe_faults build, or the dev stack, never an
// error. A name ending in '_' allows every variable it starts.
var otherEnv = []string{
	"CHATPIPE_E2E_", "CHATPIPE_SIM_", "CHATPIPE_FAULT_",
	"CHATPIPE_ARTIFACTS", "CHATPIPE_CHROMIUM", "CHATPIPE_BENCH",
	"CHATPIPE_PG_BIN", "CHATPIPE_PG_TEMPLATE", "CHATPIPE_JWT_SECRET",
}

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// flagName is the flag an environment variable (without its prefix) names.
func flagName(env string) string {
	return strings.ToLower(strings.ReplaceAll(env, "_", "-"))
}

func isOtherEnv(name string) bool {
	for _, o := range otherEnv {
		if name == o || strings.HasSuffix(o, "_") && strings.HasPrefix(name, o) {
			return true
		}
	}
	return false
}

// parseError shortens ff's wrapping of a command-line error (which the flag
// package has already printed with the usage) and keeps the others.
func parseError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if s, ok := strings.CutPrefix(err.Error(), "error parsing commandline arguments: "); ok {
		return errors.New(s)
	}
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("config file: %w", err)
	}
	return err
}

// checkEnv returns an error naming every CHATPIPE_* variable of env that
// no chatpipe command reads, and notes for those that are flags of other
// commands only (allowed: one environment may serve every role).
func checkEnv(fs *flagSet, env []string) (notes []string, err error) {
	var unknown []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		rest, ok := strings.CutPrefix(k, envPrefix)
		if !ok || isOtherEnv(k) {
			continue
		}
		if f := fs.Lookup(flagName(rest)); f != nil {
			if err := checkSyntax(f, v); v != "" && err != nil {
				return nil, fmt.Errorf("%s=%q: %w", k, v, err)
			}
			continue
		}
		if cmds, ok := fs.known[flagName(rest)]; ok {
			notes = append(notes, fmt.Sprintf("%s is not read by chatpipe %s (it is --%s of chatpipe %s)", k, fs.Name(), flagName(rest), strings.Join(cmds, ", chatpipe ")))
			continue
		}
		msg := fmt.Sprintf("unknown environment variable %s: no chatpipe command has a flag --%s", k, flagName(rest))
		if s := closest(flagName(rest), fs); s != "" {
			msg += fmt.Sprintf(" (did you mean %s?)", envName(s))
		}
		unknown = append(unknown, msg)
	}
	sort.Strings(unknown)
	sort.Strings(notes)
	if len(unknown) > 0 {
		return nil, errors.New(strings.Join(unknown, "; "))
	}
	return notes, nil
}

// parseConfigFile reads `name = value` lines (or `name value`; a value may
// be double-quoted; blank lines and lines starting with # are skipped) and
// sets each flag of fs with set.
// A name that is a flag of another command only is skipped with a note, a
// name that is a flag of none is an error.
func parseConfigFile(fs *flagSet, path string, r io.Reader, set func(name, value string) error) (notes []string, err error) {
	s := bufio.NewScanner(r)
	for n := 1; s.Scan(); n++ {
		line := strings.TrimSpace(s.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, value := line, ""
		if i := strings.IndexAny(line, "= \t"); i >= 0 {
			name, value = strings.TrimSpace(line[:i]), strings.TrimSpace(line[i:])
			value = strings.TrimSpace(strings.TrimPrefix(value, "="))
		} else if f := fs.Lookup(name); f != nil && isBool(f) {
			value = "true"
		}
		name = strings.TrimLeft(name, "-")
		if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			if u, err := strconv.Unquote(value); err == nil {
				value = u
			}
		}
		if fs.Lookup(name) == nil {
			if cmds, ok := fs.known[name]; ok {
				notes = append(notes, fmt.Sprintf("%s:%d: %s is not read by chatpipe %s (it is a flag of chatpipe %s)", path, n, name, fs.Name(), strings.Join(cmds, ", chatpipe ")))
				continue
			}
			msg := fmt.Sprintf("%s:%d: unknown key %q: no chatpipe command has a flag --%s", path, n, name, name)
			if c := closest(name, fs); c != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", c)
			}
			return nil, errors.New(msg)
		}
		if err := checkSyntax(fs.Lookup(name), value); err != nil {
			return nil, fmt.Errorf("%s:%d: %s = %q: %w", path, n, name, value, err)
		}
		if err := set(name, value); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return notes, nil
}

// checkSyntax returns an error naming f's type if v is not a value of it
// (the flag package says only "parse error").
func checkSyntax(f *flag.Flag, v string) error {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return nil
	}
	var err error
	switch g.Get().(type) {
	case bool:
		_, err = strconv.ParseBool(v)
	case int:
		_, err = strconv.ParseInt(v, 0, strconv.IntSize)
	case int64:
		_, err = strconv.ParseInt(v, 0, 64)
	case uint, uint64:
		_, err = strconv.ParseUint(v, 0, 64)
	case float64:
		_, err = strconv.ParseFloat(v, 64)
	case time.Duration:
		_, err = time.ParseDuration(v)
	default:
		return nil
	}
	if err != nil {
		kind, _ := flag.UnquoteUsage(f)
		if kind == "" {
			kind = "bool"
		}
		return fmt.Errorf("not a valid %s for --%s", kind, f.Name)
	}
	return nil
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// closest returns the flag name nearest to name by edit distance, from fs
// first and then from every command's flags, or "" if none is close.
func closest(name string, fs *flagSet) string {
	limit := max(1, len(name)/3)
	best, bestD := "", limit+1
	try := func(c string) {
		if d := editDistance(name, c); d < bestD {
			best, bestD = c, d
		}
	}
	fs.VisitAll(func(f *flag.Flag) { try(f.Name) })
	if best != "" {
		return best
	}
	for c := range fs.known {
		try(c)
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// A flagCheck returns an error if a value of fs cannot work.
type flagCheck func(fs *flag.FlagSet) error

// number returns the value of an int, int64, uint64, float64 or duration
// flag (a duration in nanoseconds); ok is false for other flags and for
// flags fs does not have.
func number(fs *flag.FlagSet, name string) (v float64, f *flag.Flag, ok bool) {
	if f = fs.Lookup(name); f == nil {
		return 0, nil, false
	}
	g, isGetter := f.Value.(flag.Getter)
	if !isGetter {
		return 0, nil, false
	}
	switch x := g.Get().(type) {
	case int:
		return float64(x), f, true
	case int64:
		return float64(x), f, true
	case uint64:
		return float64(x), f, true
	case float64:
		return x, f, true
	case time.Duration:
		return float64(x), f, true
	}
	return 0, nil, false
}

// rangeError names the flag, its variable, its value and what it must be.
func rangeError(f *flag.Flag, want string) error {
	return fmt.Errorf("--%s (%s) is %s: it must be %s", f.Name, envName(f.Name), f.Value.String(), want)
}

// inRange: name's value is within [lo, hi]; want says so in words.
func inRange(name string, lo, hi float64, want string) flagCheck {
	return func(fs *flag.FlagSet) error {
		if v, f, ok := number(fs, name); ok && (v < lo || v > hi || math.IsNaN(v)) {
			return rangeError(f, want)
		}
		return nil
	}
}

// atLeast: name's value is at least min (an integer flag's or a count's).
func atLeast(name string, min float64) flagCheck {
	return inRange(name, min, math.Inf(1), fmt.Sprintf("at least %g", min))
}

// positive: name's value is above 0 (a duration's or a rate's).
func positive(name string) flagCheck {
	return inRange(name, math.SmallestNonzeroFloat64, math.Inf(1), "above 0")
}

// notNegative: name's value is 0 or more.
func notNegative(name string) flagCheck {
	return inRange(name, 0, math.Inf(1), "0 or more")
}

// nonZero: name's value is not 0, for flags where a negative value means
// off and 0 would mean the default (or nothing at all) unnoticed.
func nonZero(name, negative string) flagCheck {
	return func(fs *flag.FlagSet) error {
		if v, f, ok := number(fs, name); ok && v == 0 {
			return rangeError(f, "above 0, or negative for "+negative)
		}
		return nil
	}
}

// notBelowFlag: name's value is at least other's plus extra.
func notBelowFlag(name, other string, extra float64, why string) flagCheck {
	return func(fs *flag.FlagSet) error {
		v, f, ok := number(fs, name)
		w, g, ok2 := number(fs, other)
		if ok && ok2 && v < w+extra {
			want := "at least --" + g.Name + " (" + g.Value.String() + ")"
			if extra != 0 {
				want = fmt.Sprintf("at least --%s (%s) + %g", g.Name, g.Value.String(), extra)
			}
			return rangeError(f, want+why)
		}
		return nil
	}
}

// aboveFlag: name's value is above other's.
func aboveFlag(name, other, why string) flagCheck {
	return func(fs *flag.FlagSet) error {
		v, f, ok := number(fs, name)
		w, g, ok2 := number(fs, other)
		if ok && ok2 && v <= w {
			return rangeError(f, "above --"+g.Name+" ("+g.Value.String()+")"+why)
		}
		return nil
	}
}

// portCheck: name's value is a TCP port, 0 (a free one) allowed if zeroOK.
func portCheck(name string, zeroOK bool) flagCheck {
	if zeroOK {
		return inRange(name, 0, 65535, "a port, 0 to 65535 (0: a free one)")
	}
	return inRange(name, 1, 65535, "a port, 1 to 65535")
}
