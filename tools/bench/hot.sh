#!/usr/bin/env bash
# Measures what isolating a hot conversation buys the conversations that
# share its vshard, on this machine, and writes a markdown section, "Hot
# conversation isolation", for BENCHMARKS.md.
#
# It runs the benchmark TestHotConversationBench (tools/bench/hotbench_test.go)
# without -race: one `chatpipe dev` with the per-user limit off and the
# per-conversation limit at its default, 500 ordinary conversations on the
# hot conversation's vshard at a paced 500 msg/s, and three phases (no hot
# conversation; the hot one at its limit on the shared vshard; the hot one
# isolated with `chatpipe admin isolate`), then a release (`admin
# unisolate`). The test starts and stops every process itself.
#
# Usage: tools/bench/hot.sh [OUT.md]   (default: tools/bench/hot/hot.md, which
# tools/bench/run.sh appends to BENCHMARKS.md as it stands, like the soak's)
# Knobs (environment), with defaults:
#   BENCH_DIR (a new temporary directory: the test's log and the section)
#   CHATPIPE_E2E_HOT_BENCH_PHASE=20s CHATPIPE_E2E_HOT_BENCH_RATE=500
#   CHATPIPE_E2E_HOT_BENCH_CLIENTS=40 CHATPIPE_E2E_HOT_BENCH_CONVS=500
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${BENCH_DIR:-$(mktemp -d /tmp/chatpipe-hot.XXXXXX)}
mkdir -p "$W"
W=$(cd "$W" && pwd)
mkdir -p tools/bench/hot
OUT=${1:-$PWD/bench/hot/hot.md}
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac

commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- . 2>/dev/null || commit="$commit (with uncommitted changes)"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)

CMD="CHATPIPE_E2E_NORACE=1 CHATPIPE_E2E_HOT_BENCH=1 go test ./tools/bench -run '^TestHotConversationBench\$' -count=1 -v -timeout 20m"
echo "hot.sh: results in $W" >&2
rc=0
CHATPIPE_E2E_NORACE=1 CHATPIPE_E2E_HOT_BENCH=1 CHATPIPE_E2E_HOT_BENCH_OUT=$W/table.md \
  go test ./tools/bench -run '^TestHotConversationBench$' -count=1 -v -timeout 20m > "$W/test.log" 2>&1 || rc=$?
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "$rc" != 0 ] || [ ! -s "$W/table.md" ]; then
  echo "hot.sh: the benchmark failed (rc $rc); see $W/test.log" >&2
  tail -40 "$W/test.log" >&2
  exit 1
fi

{
  echo "## Hot conversation isolation"
  echo
  echo "Written by \`tools/bench/hot.sh\` into tools/bench/hot/hot.md (\`tools/bench/run.sh\` appends it as it stands): the hot-conversation measurement. Command: \`$CMD\`."
  echo
  echo "Run $started, commit $commit; $cpu, $(nproc) cores shared with other work on the machine (load average at start $load_start, at end $load_end), everything (\`chatpipe dev\` with etcd, the broker, Postgres and its roles, and the test's clients) in one process tree on those cores."
  echo
  cat "$W/table.md"
} > "$OUT"
cat "$OUT"
echo "hot.sh: wrote $OUT" >&2
