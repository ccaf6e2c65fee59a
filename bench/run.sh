#!/usr/bin/env bash
# Measures chatpipe on this machine, in one go, and writes BENCHMARKS.md:
#   (a) the ceilings of the bare parts: transactional produce into the same
#       broker (same record size, same batching as chatpipe achieved) and
#       bulk insert into the same Postgres schema through persist's path;
#   (b) chatpipe end-to-end accepted/s at saturation;
#   (c) accepted latency p50/p99 at 1,000 msg/s;
#   (d) one hot conversation's max msg/s;
#   (e) takeover time (a worker joining takes its share by hand-off);
#   and the group-commit trade-off: vshards × linger budget → Kafka
#   transactions/s, accepted p99, broker CPU, at 1,000 msg/s.
#
# The broker runs as its own process (`chatpipe kafka`) so its CPU can be
# read; `chatpipe dev --kafka` uses it. Rate limits are off (the load is the
# point). Usage: bench/run.sh [OUT.md]   (BENCH_DIR keeps the raw results)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-BENCHMARKS.md}
W=${BENCH_DIR:-$(mktemp -d /tmp/chatpipe-bench.XXXXXX)}
R=$W/results
mkdir -p "$R/runs" "$R/metrics" "$R/cpu"
BIN=$W/chatpipe
SAT_RATE=${BENCH_SAT_RATE:-4000}   # offered above capacity: accepted/s is the capacity
HOT_RATE=${BENCH_HOT_RATE:-3000}
LAT_SECS=${BENCH_LAT_SECS:-30}
SAT_SECS=${BENCH_SAT_SECS:-20}
SWEEP_VSHARDS=${BENCH_SWEEP_VSHARDS:-8 64 256}
SWEEP_LINGERS=${BENCH_SWEEP_LINGERS:--1ms 5ms 20ms}
SWEEP_SECS=${BENCH_SWEEP_SECS:-10}
# A small transaction budget makes the adaptive linger engage at 1,000 msg/s
# on this machine, so the rows show what the linger budget buys.
SWEEP_BUDGET=${BENCH_SWEEP_BUDGET:-100}

log() { echo "bench: $*" >&2; }
cmd() { echo "$*" >> "$R/commands.txt"; "$@"; }

go build -o "$BIN" ./cmd/chatpipe
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "cores: $(nproc)"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "kernel: $(uname -sr)"
  echo "go: $(go version | cut -d' ' -f3-)"
  echo "postgres: $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | head -1)"
  echo "load average at start (other work on the machine): $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$R/machine.txt"
: > "$R/commands.txt"

KAFKA_PID= DEV_PID= WORKER_PID=
stop_stack() {
  for p in $WORKER_PID $DEV_PID $KAFKA_PID; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  KAFKA_PID= DEV_PID= WORKER_PID=
}
trap stop_stack EXIT

# start_stack NAME DEV-ARGS…: a broker process and `chatpipe dev` on it.
start_stack() {
  local name=$1; shift
  local d=$W/$name
  STACK=$name
  rm -rf "$d"; mkdir -p "$d"
  echo "$BIN kafka --data-dir $d/kafka --port 0 --partitions 8" >> "$R/commands.txt"
  "$BIN" kafka --data-dir "$d/kafka" --port 0 --partitions 8 --log-level warn > "$d/kafka.out" 2> "$d/kafka.log" &
  KAFKA_PID=$!
  for _ in $(seq 1 100); do [ -s "$d/kafka.out" ] && break; sleep 0.1; done
  KAFKA=$(head -1 "$d/kafka.out")
  echo "$BIN dev --data-dir $d/dev --kafka $KAFKA --rate-user -1 --rate-conv -1 $*" >> "$R/commands.txt"
  "$BIN" dev --data-dir "$d/dev" --kafka "$KAFKA" --http 127.0.0.1:0 --rate-user -1 --rate-conv -1 --log-level warn "$@" > "$d/dev.log" 2>&1 &
  DEV_PID=$!
  for _ in $(seq 1 600); do [ -f "$d/dev/endpoints.json" ] && break; sleep 0.2; done
  EP=$d/dev/endpoints.json
  METRICS=$(jq -r .metrics "$EP")
  PG=$(jq -r .postgres "$EP")
  # Warm up, then ANALYZE: a fresh database has no statistics, and until
  # autovacuum's first ANALYZE (a minute or more) the planner scans the whole
  # events table for lookups an index answers — a cost that grows with the
  # table and that an established deployment does not pay.
  "$BIN" loadgen --endpoints "$EP" --out "$W/warmup" --run "warmup-$name" --progress=false --rate 300 --duration 5s > "$d/warmup.out" 2>&1 || true
  echo "psql $PG -c ANALYZE   # after a 5 s warm-up loadgen at 300 msg/s" >> "$R/commands.txt"
  psql -q "$PG" -c ANALYZE
}

cpu_secs() { awk '{printf "%.2f\n", ($14+$15)/100}' "/proc/$1/stat"; }
# pg_secs: CPU seconds of the stack's Postgres (postmaster and its children).
pg_secs() {
  local pm; pm=$(head -1 "$W/$STACK/dev/postgres/postmaster.pid" 2>/dev/null || echo 0)
  { ps -o times= -p "$pm"; ps -o times= --ppid "$pm"; } 2>/dev/null | awk '{s+=$1} END {print s+0}'
}

# measured NAME LOADGEN-ARGS…: a loadgen run with metrics and broker CPU
# snapshots around it.
measured() {
  local name=$1; shift
  curl -s "$METRICS" > "$R/metrics/$name.before"
  local k0 d0 p0 t0; k0=$(cpu_secs "$KAFKA_PID"); d0=$(cpu_secs "$DEV_PID"); p0=$(pg_secs); t0=$(date +%s.%N)
  echo "$BIN loadgen --endpoints $EP --out $R/runs --run $name --progress=false $*" >> "$R/commands.txt"
  /usr/bin/time -f "%U %S" -o "$W/$name.time" "$BIN" loadgen --endpoints "$EP" --out "$R/runs" --run "$name" --progress=false "$@" > "$W/$name.out" 2>&1 \
    || log "loadgen $name failed (see $W/$name.out)"
  # broker before, after, wall seconds; dev (gateway, workers, persist,
  # delivery) before, after; Postgres before, after; loadgen user, sys
  echo "$k0 $(cpu_secs "$KAFKA_PID") $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}') $d0 $(cpu_secs "$DEV_PID") $p0 $(pg_secs) $(tail -1 "$W/$name.time")" > "$R/cpu/$name"
  curl -s "$METRICS" > "$R/metrics/$name.after"
}

log "results in $W"
start_stack main
log "(c) accepted latency at 1,000 msg/s"
measured lat1000 --rate 1000 --duration "${LAT_SECS}s"
cmd "$BIN" check --run "$R/runs/lat1000" > "$R/check-lat1000.txt" 2>&1 || log "check of lat1000 failed (see $R/check-lat1000.txt)"
log "(b) saturation"
measured saturation --rate "$SAT_RATE" --duration "${SAT_SECS}s" --drain 90s
log "(d) one hot conversation"
measured hot --profile hot --rate "$HOT_RATE" --duration 15s --drain 90s
log "(e) takeover: a third worker joins and takes its share"
echo "$BIN worker --endpoints $EP --id w3 --log-level info" >> "$R/commands.txt"
"$BIN" worker --endpoints "$EP" --id w3 --log-level info > "$R/takeover.log" 2>&1 &
WORKER_PID=$!
sleep 20
kill "$WORKER_PID"; wait "$WORKER_PID" 2>/dev/null || true; WORKER_PID=
log "(a) ceilings on the same broker and Postgres"
batch=$(go run ./bench/report -batch "$R/metrics/saturation")
vshards=$(jq -r .vshards "$EP")
echo "BENCH_KAFKA=$KAFKA BENCH_PG=$PG BENCH_PRODUCERS=$vshards BENCH_BATCH=$batch go test ./bench -run '^\$' -bench . -benchtime 3s" >> "$R/commands.txt"
BENCH_KAFKA=$KAFKA BENCH_PG=$PG BENCH_PRODUCERS=$vshards BENCH_BATCH=$batch \
  go test ./bench -run '^$' -bench . -benchtime 3s > "$R/bench.txt" 2>&1 || log "go test -bench failed (see $R/bench.txt)"
stop_stack

log "trade-off: vshards × linger budget at 1,000 msg/s (--txn-budget $SWEEP_BUDGET)"
echo "$SWEEP_BUDGET" > "$R/sweep-budget.txt"
: > "$R/sweep.txt"
for v in $SWEEP_VSHARDS; do
  for l in $SWEEP_LINGERS; do
    name=sweep-$v-${l/-1ms/off}
    start_stack "$name" --vshards "$v" --linger-max "$l" --txn-budget "$SWEEP_BUDGET"
    measured "$name" --rate 1000 --duration "${SWEEP_SECS}s"
    echo "$v $l $name" >> "$R/sweep.txt"
    stop_stack
  done
done

go run ./bench/report -dir "$R" -out "$OUT"
# The soak (bench/soak.sh, 30 minutes) is not run here: its last result is
# kept in bench/soak/soak.md and appended as it stands.
if [ -f bench/soak/soak.md ]; then
  { echo; cat bench/soak/soak.md; } >> "$OUT"
fi
log "wrote $OUT"
