#!/usr/bin/env bash
# Long nemesis run: e2e TestNemesis (a seeded random schedule of worker
# kills, pauses past the lease, graceful worker restarts, persist kills
# and broker restarts while clients send, with members kicked and joined
# again over and over in conversations isolated to
# dedicated vshards and released again, and devices that reconnect and
# sync), then the table of what it injected and of every count that must be
# zero, from the report the test writes (CHATPIPE_E2E_NEMESIS_REPORT).
#
# Knobs (environment):
#   NEMESIS_DURATION=30m   how long faults are injected (the test heals and
#                          checks afterwards, a few minutes more)
#   NEMESIS_SEED=          replay a schedule (default: the test picks one)
#   NEMESIS_RACE=0         1: build chatpipe with -race (slower)
#   RESULTS                results dir (default: a new /tmp/chatpipe-nemesis.XXXXXX)
#
# Output in $RESULTS: report.json (the test's counts), table.md (the
# markdown table), test.log (go test -v). Exits non-zero if the test failed
# or any must-be-zero count is not zero.
set -euo pipefail
cd "$(dirname "$0")/../.."
NEMESIS_DURATION=${NEMESIS_DURATION:-30m}
NEMESIS_SEED=${NEMESIS_SEED:-}
NEMESIS_RACE=${NEMESIS_RACE:-0}
RESULTS=${RESULTS:-$(mktemp -d /tmp/chatpipe-nemesis.XXXXXX)}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
command -v jq >/dev/null || { echo "nemesis: jq is needed for the table" >&2; exit 2; }

log() { echo "nemesis: $(date -u +%H:%M:%S) $*" >&2; }

# go test's own timeout: the faults, then healing, the load's last sends,
# the checks and the processes' stops.
secs() { # a Go duration of h, m and s parts in seconds
  local d=$1 total=0 n
  while [[ $d =~ ^([0-9]+)([hms])(.*)$ ]]; do
    n=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in h) n=$((n * 3600)) ;; m) n=$((n * 60)) ;; esac
    total=$((total + n))
    d=${BASH_REMATCH[3]}
  done
  [ -z "$d" ] || { echo "nemesis: NEMESIS_DURATION=$1: use h, m and s only" >&2; exit 2; }
  echo "$total"
}
timeout_s=$(($(secs "$NEMESIS_DURATION") + 1200))

env_args=(CHATPIPE_E2E_LONG=1 CHATPIPE_E2E_NEMESIS_DURATION="$NEMESIS_DURATION" CHATPIPE_E2E_NEMESIS_REPORT="$RESULTS/report.json")
[ -n "$NEMESIS_SEED" ] && env_args+=(CHATPIPE_E2E_NEMESIS_SEED="$NEMESIS_SEED")
[ "$NEMESIS_RACE" = 1 ] || env_args+=(CHATPIPE_E2E_NORACE=1)
rm -f "$RESULTS/report.json"

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
log "TestNemesis for $NEMESIS_DURATION of faults; results in $RESULTS"
rc=0
env "${env_args[@]}" go test ./e2e -run 'TestNemesis$' -count=1 -v -timeout "${timeout_s}s" >"$RESULTS/test.log" 2>&1 || rc=$?
ended=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if [ ! -s "$RESULTS/report.json" ]; then
  log "the test wrote no report (exit $rc); the end of its log:"
  tail -40 "$RESULTS/test.log" >&2
  exit 1
fi

R=$RESULTS/report.json
{
  echo "Run $started → $ended, seed $(jq -r .seed "$R"), faults for $(jq -r .duration "$R")$([ "$NEMESIS_RACE" = 1 ] && echo ", -race"); test $([ $rc = 0 ] && echo passed || echo "FAILED (exit $rc)")."
  echo
  echo "| fault | injected | longest send gap after it |"
  echo "|---|---:|---:|"
  jq -r '. as $r | ($r.faults | keys[]) as $k | "| \($k) | \($r.faults[$k]) | \(($r.max_send_gap_ms[$k] // 0) / 1000 * 10 | round / 10) s |"' "$R"
  jq -r '"| none yet (before the first fault) | – | \((.max_send_gap_ms.none // 0) / 1000 * 10 | round / 10) s |"' "$R"
  jq -r '"| **total** | \([.faults[]] | add) | |"' "$R"
  echo
  echo "| count | value |"
  echo "|---|---:|"
  jq -r '"| messages accepted | \(.accepted) |",
         "| events in the committed log | \(.log_events) |",
         "| client reconnects | \(.reconnects) |",
         "| kick/join cycles of the churned members | \(.kick_cycles) |",
         "| moves (admin isolate/unisolate, by outcome) | \(.moves // {} | to_entries | map("\(.key) ×\(.value)") | join(", ")) |",
         "| devices checked after a final sync | \(.devices) |"' "$R"
  jq -r '.zero | "| lost accepted | \(.lost_accepted) |",
         "| not persisted | \(.not_persisted // 0) |",
         "| duplicated | \(.duplicated) |",
         "| seq collision | \(.seq_collision) |",
         "| seq gap | \(.seq_gap) |",
         "| regression | \(.regression) |",
         "| aborted visible | \(.aborted_visible) |",
         "| post-kick | \(.post_kick) |",
         "| rejected but stored | \(.rejected_stored // 0) |",
         "| device divergence | \(.device_divergence) |",
         "| stale epoch after a newer one | \(.stale_epoch) |",
         "| unwritable conversations after the faults | \(.unwritable // 0) |"' "$R"
} >"$RESULTS/table.md"
cat "$RESULTS/table.md"
nonzero=$(jq '[.zero[]] | map(select(. != 0)) | length' "$R")
if [ "$rc" != 0 ] || [ "$nonzero" != 0 ]; then
  log "FAILED: test exit $rc, $nonzero must-be-zero counts not zero (see $RESULTS/test.log)"
  exit 1
fi
log "passed"
