#!/usr/bin/env bash
# flaky.sh — rerun the tests most exposed to timing, N times each.
#
# Usage: tools/scripts/flaky.sh [-n N] [-r REGEXP] [-p PACKAGE] [-a]
#
#   -n N        runs of each test (default 30)
#   -a          run the whole package N times instead, as the README's
#               test command does: every test beside the others the
#               pool lets run with it (the long runs skip themselves)
#   -r REGEXP   the tests to run, a go test -run pattern (default: the
#               tests below)
#   -p PACKAGE  the package (default ./e2e)
#
# Each test runs N times in a row, race detector on, one test at a time
# (go test -count=N -p 1), so that a run is not slowed by its neighbours.
# The output goes to flaky-<test>.log in the current directory; the
# script prints a line per test, "ok" or "FAIL" with the failures'
# first lines, and exits non-zero if any run failed.
#
# The default list: the tests that once failed on their own
# (TestProducerEpochRotation, TestClientOfflineDeviceConverges,
# TestNemesis) and those that wait on leases, takeovers, moves and
# consumers catching up. Pass -r to run others:
#
#   tools/scripts/flaky.sh -n 30 -r '^TestProducerEpochRotation$'
#   tools/scripts/flaky.sh -n 5
#   tools/scripts/flaky.sh -a -n 5     # the package, 5 times
#
# The deadline of each go test run grows with N (6 minutes a run, at
# least 10 minutes), so a hung run ends the script instead of CI's
# timeout. It needs what the README's test command needs (Postgres
# server binaries; see .ci/run).
set -euo pipefail

usage() { sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; }

n=30
pkg=./e2e
whole=0
tests=(
  TestProducerEpochRotation
  TestClientOfflineDeviceConverges
  TestNemesis
  TestPausedWriterIsFenced
  TestReversedTakeoverOrderIsCaught
  TestSecuredPausedWriterIsFenced
  TestPausedPastTxnTimeout
  TestKilledWriterBetweenProduceAndCommit
  TestKilledOnlyWorker
  TestClientSurvivesWorkerKill
  TestStarvedKeepAlive
  TestEtcdQuorumLoss
  TestEtcdLeaderStall
  TestAddWorkerUnderLoad
  TestIsolateUnderLoad
  TestUnisolateWhilePersistIsBehind
  TestMoveFromBusyVShard
  TestMoveWithMergedLoads
  TestKilledPersistResumes
  TestKickVersusSend
)
while getopts "n:r:p:ah" opt; do
  case $opt in
    a) whole=1 ;;
    n) n=$OPTARG ;;
    r) tests=("$OPTARG") ;;
    p) pkg=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
case $n in ''|*[!0-9]*|0) echo "flaky.sh: -n wants a positive number, got '$n'" >&2; exit 2 ;; esac

if [ "$whole" = 1 ]; then
  # The whole package, N times, as the README's command runs it (without
  # the long runs): a test that fails only beside some neighbour shows
  # here; each test's log says what ran beside it.
  failed=0
  for i in $(seq 1 "$n"); do
    log="flaky-package-$i.log"
    start=$(date +%s)
    if GORACE=atexit_sleep_ms=0 go test -race -count=1 -timeout 60m -v "$pkg" >"$log" 2>&1; then
      printf 'package run %d of %d ok in %ds\n' "$i" "$n" $(( $(date +%s) - start ))
    else
      failed=1
      printf 'package run %d of %d FAIL in %ds (%s)\n' "$i" "$n" $(( $(date +%s) - start )) "$log"
      grep -A3 -- '--- FAIL' "$log" | head -12 | sed 's/^/    /'
    fi
  done
  exit $failed
fi

# The long runs (TestNemesis) skip themselves without this.
export CHATPIPE_E2E_LONG=1

timeout_min=$((n * 6))
[ "$timeout_min" -ge 10 ] || timeout_min=10
failed=0
for test in "${tests[@]}"; do
  pattern=$test
  case $test in ^*) ;; *) pattern="^${test}\$" ;; esac
  log="flaky-$(printf '%s' "$test" | tr -d '^$' | tr -c 'A-Za-z0-9_' '_').log"
  start=$(date +%s)
  if go test -race -p 1 -count="$n" -timeout "${timeout_min}m" -run "$pattern" "$pkg" >"$log" 2>&1; then
    printf '%-45s ok   %d runs in %ds\n' "$test" "$n" $(( $(date +%s) - start ))
  else
    failed=1
    fails=$(grep -c -- '^--- FAIL' "$log" || true)
    printf '%-45s FAIL %s of %d runs failed in %ds (%s)\n' "$test" "$fails" "$n" $(( $(date +%s) - start )) "$log"
    grep -A3 -- '^--- FAIL' "$log" | head -12 | sed 's/^/    /'
  fi
done
exit $failed
