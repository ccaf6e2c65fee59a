#!/usr/bin/env bash
# Measures chatpipe on this machine, in one go, and writes BENCHMARKS.md.
#
# The roles run as separate processes, as in tools/bench/soak.sh: a broker
# (`chatpipe kafka`), `chatpipe dev` hosting etcd and a private Postgres
# only (its own roles off), and `chatpipe persist` (the events and the
# read model), `chatpipe worker` ×2 (w1, w2) and `chatpipe gateway` on its
# endpoints.json. `chatpipe loadgen` drives the separate gateway. Everything
# shares the machine's cores. Rate limits are off (the load is the point).
#
# Runs on that one stack (peak mix unless said):
#   lat1000     1,000 msg/s: accepted and delivery latency, CPU per message
#   r3000       3,000 msg/s: CPU per message; the CPU profile of every
#               chatpipe role is taken during it
#   saturation  offered BENCH_SAT_RATE (above capacity): accepted/s is the
#               capacity; CPU per message
#   one1        1:1 conversations, one device per user (--devices 1
#               --groups 0) at BENCH_ONE_RATE: CPU per message
#   idle        the stack with nothing sent for BENCH_IDLE_SECS (after the
#               warm-up and 20 s to settle): CPU and Postgres statements
#   hot         one hot conversation's max msg/s
#   pgpause     1,000 msg/s with Postgres paused (SIGSTOP) for
#               BENCH_PAUSE_SECS from 10 s into the send phase: accepted/s
#               while Postgres does not answer
#   takeover    a third worker joins and takes its share by hand-off
#   ceiling     the bare pipeline (tools/bench/ceiling): transactional producers →
#               the same broker → persist's read_committed consumer → the
#               same Postgres, sustained records/s
#   ceiling1000 the same bare pipeline paced at 1,000 records/s, a producer
#               per vshard and one record per transaction (the writers'
#               shape at light load): CPU per record
#   go test -bench ./bench: produce and Postgres-write ceilings
#   floor       what one small loopback TCP write costs here (tools/bench/floor),
#               once at one frame per write and once at BENCH_FLOOR_BATCH,
#               paced like r3000's deliveries, after the stack is stopped;
#               and a bare websocket server (floor -ws), one message per frame,
#               at that rate and in lat1000's and r3000's shapes (their
#               devices and event frames a second: goal 7's anchors)
# and, with BENCH_SWEEP=1, the group-commit trade-off (vshards × linger
# budget, each a fresh all-in-one stack).
#
# CPU per process is read from /proc/PID/stat (utime + stime) at the start
# of a run's send phase and when its last answer is in (loadgen's phase
# file: send → converge), so connect, conversation setup and the final
# device sync are not counted. Postgres is its postmaster, its live
# children and its waited-for children. Context switches per process are
# read the same way, from /proc/PID/task/*/status (every thread).
# Postgres' statements are read at the same points from pg_stat_statements
# (dev runs with --postgres-stats) and pg_stat_database, and each role's
# own count of its round trips from its metrics
# (chatpipe_postgres_statements_total).
#
# Usage: tools/bench/run.sh [OUT.md]   (BENCH_DIR keeps the raw results)
# Knobs (environment), with defaults:
#   BENCH_LAT_SECS=30 BENCH_MID_RATE=3000 BENCH_MID_SECS=30
#   BENCH_SAT_RATE=10000 BENCH_SAT_SECS=20 BENCH_ONE_RATE=3000 BENCH_ONE_SECS=30
#   BENCH_HOT_RATE=3000 BENCH_HOT_SECS=15 BENCH_PAUSE_SECS=30 BENCH_TAKEOVER_SECS=20
#   BENCH_IDLE_SECS=60 (CPU is read in 10 ms ticks: 60 s resolves 0.02 %
#   of a core per process)
#   BENCH_PROF_SECS=20 (profile length, inside r3000's send phase)
#   BENCH_CEIL_SECS=20 BENCH_CEIL_PRODUCERS=16 BENCH_CEIL_BATCH=50
#   BENCH_GOBENCH=1 (0 skips go test -bench) BENCH_BENCHTIME=3s
#   BENCH_FLOOR_SECS=10 BENCH_FLOOR_CONNS=1200 BENCH_FLOOR_RATE=30000 BENCH_FLOOR_BATCH=10
#   BENCH_SWEEP=0 (1 runs the sweep; BENCH_SWEEP_VSHARDS, _LINGERS, _SECS, _BUDGET)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-BENCHMARKS.md}
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
W=${BENCH_DIR:-$(mktemp -d /tmp/chatpipe-bench.XXXXXX)}
mkdir -p "$W"
W=$(cd "$W" && pwd)
R=$W/results
mkdir -p "$R/runs" "$R/metrics" "$R/cpu" "$R/switches" "$R/prof" "$R/logs" "$R/pgstat"
L=$R/logs
BIN=$W/chatpipe
LAT_SECS=${BENCH_LAT_SECS:-30}
MID_RATE=${BENCH_MID_RATE:-3000}
MID_SECS=${BENCH_MID_SECS:-30}
# Offered above capacity, so accepted/s is the capacity; short enough that
# the backlog stays under loadgen's 10 s re-send timeout (the report says
# whether the run saturated).
SAT_RATE=${BENCH_SAT_RATE:-10000}
SAT_SECS=${BENCH_SAT_SECS:-20}
ONE_RATE=${BENCH_ONE_RATE:-3000}
ONE_SECS=${BENCH_ONE_SECS:-30}
HOT_RATE=${BENCH_HOT_RATE:-3000}
HOT_SECS=${BENCH_HOT_SECS:-15}
PAUSE_SECS=${BENCH_PAUSE_SECS:-30}
IDLE_SECS=${BENCH_IDLE_SECS:-60}
TAKEOVER_SECS=${BENCH_TAKEOVER_SECS:-20}
PROF_SECS=${BENCH_PROF_SECS:-20}
CEIL_SECS=${BENCH_CEIL_SECS:-20}
CEIL_PRODUCERS=${BENCH_CEIL_PRODUCERS:-16}
CEIL_BATCH=${BENCH_CEIL_BATCH:-50}
GOBENCH=${BENCH_GOBENCH:-1}
BENCHTIME=${BENCH_BENCHTIME:-3s}
FLOOR_SECS=${BENCH_FLOOR_SECS:-10}
FLOOR_CONNS=${BENCH_FLOOR_CONNS:-1200}
FLOOR_RATE=${BENCH_FLOOR_RATE:-30000}
FLOOR_BATCH=${BENCH_FLOOR_BATCH:-10}
SWEEP=${BENCH_SWEEP:-0}
SWEEP_VSHARDS=${BENCH_SWEEP_VSHARDS:-8 64 256}
SWEEP_LINGERS=${BENCH_SWEEP_LINGERS:--1ms 5ms 20ms}
SWEEP_SECS=${BENCH_SWEEP_SECS:-10}
# A small transaction budget makes the adaptive linger engage at 1,000 msg/s
# on this machine, so the rows show what the linger budget buys.
SWEEP_BUDGET=${BENCH_SWEEP_BUDGET:-100}
NOLIMIT=(--rate-user -1 --rate-conv -1)

log() { echo "bench: $(date -u +%H:%M:%S) $*" >&2; }
TCK=$(getconf CLK_TCK)
cmd() { echo "$*" >> "$R/commands.txt"; "$@"; }

go build -o "$BIN" ./cmd/chatpipe
go build -o "$W/ceiling" ./tools/bench/ceiling
go build -o "$W/floor" ./tools/bench/floor
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
cat > "$R/knobs.txt" << EOF
lat_secs $LAT_SECS
mid_rate $MID_RATE
mid_secs $MID_SECS
sat_rate $SAT_RATE
sat_secs $SAT_SECS
one_rate $ONE_RATE
one_secs $ONE_SECS
hot_rate $HOT_RATE
hot_secs $HOT_SECS
prof_secs $PROF_SECS
ceil_secs $CEIL_SECS
idle_secs $IDLE_SECS
pause_secs $PAUSE_SECS
EOF

# Every process started here, in start order; stopped in reverse.
PIDS=()
stop_all() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true
  done
  # (a role that cannot finish its shutdown in 20 s is killed)
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    for _ in $(seq 1 100); do kill -0 "${PIDS[i]}" 2>/dev/null || break; sleep 0.2; done
    kill -9 "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  PIDS=()
}
# A Postgres left paused by an interrupted pgpause run is resumed first.
# (kill fails once Postgres is gone; under set -e that must not end the
# trap, nor make the script's status 1)
trap '{ [ -z "${PM:-}" ] || kill -CONT "$PM" 2>/dev/null || true; }; stop_all' EXIT
trap 'exit 130' INT TERM

# wait_for FILE PATTERN: the first match of PATTERN (sed -n regex with one
# group) in FILE, waiting up to 60 s.
wait_for() {
  local v
  for _ in $(seq 1 300); do
    v=$(sed -n "$2" "$1" 2>/dev/null | head -1)
    [ -n "$v" ] && { echo "$v"; return 0; }
    sleep 0.2
  done
  log "timed out waiting for $2 in $1"; tail -5 "$1" >&2 || true
  return 1
}

# The measured processes: name, pid, admin address ("" if none).
NAMES=() PPIDS=() ADMINS=()
add_proc() { NAMES+=("$1"); PPIDS+=("$2"); ADMINS+=("$3"); }
admin_of() { local i; for i in "${!NAMES[@]}"; do [ "${NAMES[i]}" != "$1" ] || echo "${ADMINS[i]}"; done; }

# The separate-process stack; sets KAFKA, EP (dev's endpoints), SEP (the
# separate gateway's), PG, PM (postmaster pid).
start_roles() {
  local d=$W/stack
  rm -rf "$d"; mkdir -p "$d"
  log "broker"
  # 10 partitions: dev's 8 for the hashed vshards and one for each of its 2
  # dedicated vshards (dev refuses a topic of another shape).
  echo "$BIN kafka --data-dir $d/kafka --port 0 --partitions 10 --admin 127.0.0.1:0" >> "$R/commands.txt"
  "$BIN" kafka --data-dir "$d/kafka" --port 0 --partitions 10 --admin 127.0.0.1:0 --log-level info > "$L/kafka.out" 2> "$L/kafka.log" &
  PIDS+=($!)
  local kpid=$!
  KAFKA=$(wait_for "$L/kafka.out" 's/^\(127\.0\.0\.1:[0-9]*\)$/\1/p')
  add_proc broker "$kpid" "$(wait_for "$L/kafka.log" 's/.*kafka admin listening.* admin=\([0-9.:]*\).*/\1/p')"

  log "dev (etcd, Postgres; no gateway traffic, workers or persist in it)"
  echo "$BIN dev --data-dir $d/dev --kafka $KAFKA --workers 0 --persist=false --postgres-stats" >> "$R/commands.txt"
  "$BIN" dev --data-dir "$d/dev" --kafka "$KAFKA" --http 127.0.0.1:0 --workers 0 --persist=false --postgres-stats \
    --log-level warn > "$L/dev.out" 2> "$L/dev.log" &
  PIDS+=($!)
  local dpid=$!
  for _ in $(seq 1 600); do [ -f "$d/dev/endpoints.json" ] && break; sleep 0.2; done
  EP=$d/dev/endpoints.json
  [ -f "$EP" ] || { log "dev did not write endpoints.json"; tail -20 "$L/dev.log" >&2; exit 1; }
  PG=$(jq -r .postgres "$EP")
  local a; a=$(jq -r .admin "$EP"); add_proc dev "$dpid" "${a#http://}"

  start_role persist 's/.*persist starting.* admin=\([0-9.:]*\).*/\1/p' persist
  start_role w1 's/.*worker starting.* admin=\([0-9.:]*\).*/\1/p' worker --id w1 "${NOLIMIT[@]}"
  start_role w2 's/.*worker starting.* admin=\([0-9.:]*\).*/\1/p' worker --id w2 "${NOLIMIT[@]}"
  start_role gateway 's/.*gateway admin listening.* admin=\([0-9.:]*\).*/\1/p' gateway --http 127.0.0.1:0 --data-dir "$d/dev" "${NOLIMIT[@]}"
  GW=$(wait_for "$L/gateway.log" 's/.*gateway listening.* addr=\([0-9.:]*\).*/\1/p')
  for _ in $(seq 1 300); do curl -sf "http://$GW/readyz" > /dev/null && break; sleep 0.2; done
  SEP=$W/bench-endpoints.json
  jq --arg gw "$GW" '.websocket = "ws://\($gw)/v1/ws" | .http = "http://\($gw)" | .metrics = "http://\($gw)/metrics"' "$EP" > "$SEP"
  DATA=$d/dev
  PM=$(head -1 "$d/dev/postgres/postmaster.pid" 2>/dev/null || echo)

  # Warm up (every vshard gets its writer, the tables exist), then ANALYZE:
  # see docs/loadgen.md, "A fresh stack".
  log "warm-up"
  "$BIN" loadgen --endpoints "$SEP" --data-dir "$DATA" --out "$W/warmup" --run warmup --progress=false --rate 300 --duration 5s \
    > "$L/warmup.out" 2>&1 || log "warm-up loadgen failed (see $L/warmup.out)"
  echo "psql $PG -c ANALYZE   # after a 5 s warm-up loadgen at 300 msg/s" >> "$R/commands.txt"
  psql -q "$PG" -c ANALYZE
}

start_role() { # NAME LOG-PATTERN ARGS…
  local name=$1 pat=$2; shift 2
  echo "$BIN $* --endpoints $EP" >> "$R/commands.txt"
  "$BIN" "$@" --endpoints "$EP" --log-level info > "$L/$name.out" 2> "$L/$name.log" &
  PIDS+=($!)
  local pid=$! addr
  addr=$(wait_for "$L/$name.log" "$pat")
  add_proc "$name" "$pid" "$addr"
}

# snap FILE [LOADGEN-PID]: one "name cpu_seconds" line per process, and the
# wall clock; and the same with context switches (every thread's voluntary
# and involuntary ones) in switches/ beside cpu/. Postgres is its
# postmaster (its own and its waited-for children's CPU) and its live
# children. Every process's /proc files are read in one pass: a fork per
# process (Postgres alone has dozens of backends) spread one snapshot over
# seconds on a loaded machine, and the metrics taken after it with it.
# The postmaster is read before its backends and again after them: a
# backend that exits and is reaped in between is in neither its
# waited-for CPU nor the live children
# (a client closing its connections as its window ends took a whole
# backend's CPU out of a window, which came out negative), so a read whose
# two postmaster counts differ is taken again.
snap() {
  local try
  for try in 1 2 3 4 5; do
    snap_once "$@" && return 0
  done
  log "snap $1: the postmaster reaped a backend during each of 5 reads; the last is kept"
}
snap_once() {
  local i p map= wall st=0
  local stats=() tasks=()
  for i in "${!NAMES[@]}"; do
    map+="${PPIDS[i]} ${NAMES[i]};"
    stats+=("/proc/${PPIDS[i]}/stat")
    tasks+=(/proc/"${PPIDS[i]}"/task/*/status)
  done
  if [ -n "${2:-}" ]; then
    map+="$2 loadgen;"
    stats+=("/proc/$2/stat")
    tasks+=(/proc/"$2"/task/*/status)
  fi
  if [ -n "$PM" ] && [ -d "/proc/$PM" ]; then
    for p in "$PM" $(pgrep -P "$PM" 2>/dev/null || true); do
      map+="$p postgres;"
      stats+=("/proc/$p/stat")
      tasks+=(/proc/"$p"/task/*/status)
    done
    stats+=("/proc/$PM/stat") # (read again, last)
  fi
  wall=$(date +%s.%N)
  # /proc/PID/stat: after the command's ")", field 12 is utime, 13 stime,
  # 14 and 15 the waited-for children's. (grep fails on a process gone:
  # it is left out.) Exit status 3: the postmaster's two reads differ.
  { grep -s -H '' "${stats[@]}" || true; } | awk -v map="$map" -v t="$TCK" -v pm="${PM:-}" -v wall="$wall" '
    BEGIN { n = split(map, m, ";"); for (i = 1; i <= n; i++) if (split(m[i], kv, " ") == 2) name[kv[1]] = kv[2] }
    { split($0, f, "/"); pid = f[3]; sub(/^.*\) /, ""); split($0, x, " ")
      if (pid == pm && seen++) { torn = x[14] + x[15] != reaped; next }
      c = x[12] + x[13]; if (pid == pm) { reaped = x[14] + x[15]; c += reaped }; s[name[pid]] += c }
    END { print "wall", wall; for (k in s) printf "%s %.2f\n", k, s[k] / t; if (torn) exit 3 }' > "$1" || st=$?
  case $st in
    0 | 3) ;;
    *) log "snap $1: reading CPU failed (status $st)"; st=0 ;;
  esac
  { grep -s -H -E '^(non)?voluntary_ctxt_switches:' "${tasks[@]}" || true; } | awk -v map="$map" -v wall="$wall" '
    BEGIN { n = split(map, m, ";"); for (i = 1; i <= n; i++) if (split(m[i], kv, " ") == 2) name[kv[1]] = kv[2] }
    { split($1, f, "/"); s[name[f[3]]] += $2 }
    END { print "wall", wall; for (k in s) print k, s[k] }' > "$R/switches/$(basename "$1")"
  [ "$st" = 0 ]
}
# metrics SUFFIX RUN: every chatpipe role's /metrics, each in its own file
# (metrics/RUN.ROLE.SUFFIX; tools/bench/report reads the workers' counters
# from w1's and w2's).
metrics() {
  local i
  for i in "${!NAMES[@]}"; do
    [ -n "${ADMINS[i]}" ] && curl -s -m 10 "http://${ADMINS[i]}/metrics" > "$R/metrics/$2.${NAMES[i]}.$1" 2>/dev/null || true
  done
}
phase_of() { cat "$R/runs/$1/phase" 2>/dev/null || true; }

# pgstat FILE: each database's transactions (pg_stat_database: "xact
# DB COMMITS ROLLBACKS") and every statement's calls and total execution
# ms (pg_stat_statements: "stmt DB QUERYID CALLS MS TEXT", the text on one
# line; DB "dropped" for a database dropped since, as the ceiling's
# scratch database is), leaving out these reads themselves. Nothing when Postgres does
# not answer in 10 s.
pgstat() {
  [ -n "${PG:-}" ] || return 0
  PGCONNECT_TIMEOUT=10 timeout 15 psql -X -q -At -F ' ' "$PG" -c "
    SELECT 'xact', datname, xact_commit, xact_rollback FROM pg_stat_database WHERE datname IS NOT NULL;
    SELECT 'stmt', coalesce(d.datname, 'dropped'), s.queryid, s.calls, round(s.total_exec_time::numeric, 3), regexp_replace(s.query, '\s+', ' ', 'g')
      FROM pg_stat_statements s LEFT JOIN pg_database d ON d.oid = s.dbid
      WHERE s.query NOT LIKE '%pg_stat_%'" > "$1" 2>/dev/null || true
}

# profile RUN: a CPU profile of every chatpipe role, PROF_SECS long, in the
# background; its top 15 is written by profile_tops.
PROF_PIDS=()
profile() {
  local role a
  for role in gateway w1 w2 persist dev; do
    a=$(admin_of "$role")
    [ -n "$a" ] || continue
    curl -s -m $((PROF_SECS + 30)) -o "$R/prof/$role.pb.gz" "http://$a/debug/pprof/profile?seconds=$PROF_SECS" &
    PROF_PIDS+=($!)
  done
  echo "$1 $PROF_SECS" > "$R/prof/run.txt"
}
profile_tops() {
  local p f role
  for p in "${PROF_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PROF_PIDS=()
  for f in "$R"/prof/*.pb.gz; do
    [ -s "$f" ] || continue
    role=$(basename "$f" .pb.gz)
    go tool pprof -top -nodecount=15 "$BIN" "$f" > "$R/prof/$role.top" 2> "$R/prof/$role.err" \
      || log "pprof of $role failed (see $R/prof/$role.err)"
    go tool pprof -top -cum -nodecount=15 "$BIN" "$f" > "$R/prof/$role.cum" 2>> "$R/prof/$role.err" || true
  done
}

# measured NAME [--pprof] LOADGEN-ARGS…: a loadgen run with CPU
# snapshots at the start of its send phase (cpu/NAME.send) and when its
# last answer is in (cpu/NAME.end), and metrics around it.
measured() {
  local name=$1; shift
  local prof=0
  if [ "${1:-}" = --pprof ]; then prof=1; shift; set -- --cpuprofile "$R/prof/loadgen.pb.gz" "$@"; fi
  metrics before "$name"
  echo "$BIN loadgen --endpoints $SEP --data-dir $DATA --out $R/runs --run $name --progress=false $*" >> "$R/commands.txt"
  "$BIN" loadgen --endpoints "$SEP" --data-dir "$DATA" --out "$R/runs" --run "$name" --progress=false "$@" > "$L/$name.out" 2>&1 &
  local lg=$! ph= sent=0 ended=0
  PIDS+=("$lg")
  while kill -0 "$lg" 2>/dev/null; do
    ph=$(phase_of "$name")
    if [ "$sent" = 0 ] && [ "$ph" = send ]; then
      snap "$R/cpu/$name.send" "$lg"; metrics send "$name"; pgstat "$R/pgstat/$name.send"; sent=1
      if [ "$prof" = 1 ]; then profile "$name"; fi
    fi
    if [ "$sent" = 1 ] && [ "$ended" = 0 ] && { [ "$ph" = converge ] || [ "$ph" = report ]; }; then
      snap "$R/cpu/$name.end" "$lg"; metrics end "$name"; pgstat "$R/pgstat/$name.end"; ended=1
    fi
    sleep 0.05
  done
  wait "$lg" || log "loadgen $name failed (see $L/$name.out)"
  unset 'PIDS[${#PIDS[@]}-1]' # (lg, added last)
  [ "$ended" = 1 ] || log "loadgen $name: no send → converge window seen; its CPU is not reported"
  if [ "$prof" = 1 ]; then profile_tops; fi
  metrics after "$name"
  local rc=0
  cmd "$BIN" check --run "$R/runs/$name" > "$R/check-$name.txt" 2>&1 || rc=$?
  echo "$rc" > "$R/check-$name.rc"
  [ "$rc" = 0 ] || log "check of $name failed (see $R/check-$name.txt)"
}

log "results in $W"
start_roles
log "idle: nothing sent for ${IDLE_SECS}s, after 20 s to settle"
sleep 20
snap "$R/cpu/idle.send"; metrics send idle; pgstat "$R/pgstat/idle.send"
sleep "$IDLE_SECS"
snap "$R/cpu/idle.end"; metrics end idle; pgstat "$R/pgstat/idle.end"
log "lat1000: peak mix at 1,000 msg/s for ${LAT_SECS}s"
measured lat1000 --rate 1000 --duration "${LAT_SECS}s"
log "r3000: peak mix at $MID_RATE msg/s for ${MID_SECS}s, profiling every role for ${PROF_SECS}s"
measured r3000 --pprof --rate "$MID_RATE" --duration "${MID_SECS}s" --drain 90s
log "saturation: peak mix offered $SAT_RATE msg/s for ${SAT_SECS}s"
measured saturation --rate "$SAT_RATE" --duration "${SAT_SECS}s" --drain 90s
log "one1: 1:1 conversations, one device, $ONE_RATE msg/s for ${ONE_SECS}s"
measured one1 --rate "$ONE_RATE" --devices 1 --groups 0 --duration "${ONE_SECS}s" --drain 90s
log "hot: one hot conversation"
measured hot --profile hot --rate "$HOT_RATE" --duration "${HOT_SECS}s" --drain 90s
if [ -n "$PM" ]; then
  log "pgpause: peak mix at 1,000 msg/s for $((PAUSE_SECS + 20))s, Postgres paused for ${PAUSE_SECS}s from 10 s in"
  (
    until [ "$(phase_of pgpause)" = send ]; do sleep 0.05; done
    sleep 10
    metrics pause pgpause
    echo "kill -STOP $PM   # Postgres, for ${PAUSE_SECS}s" >> "$R/commands.txt"
    kill -STOP "$PM"
    sleep "$PAUSE_SECS"
    metrics resume pgpause
    kill -CONT "$PM"
    echo "$PAUSE_SECS" > "$R/pgpause-secs"
  ) &
  pauser=$!
  measured pgpause --rate 1000 --duration "$((PAUSE_SECS + 20))s" --drain 90s
  wait "$pauser" || true
else
  log "pgpause: skipped (no postmaster pid)"
fi

log "takeover: a third worker joins and takes its share"
echo "$BIN worker --endpoints $EP --id w3 --log-level info" >> "$R/commands.txt"
"$BIN" worker --endpoints "$EP" --id w3 "${NOLIMIT[@]}" --log-level info > "$R/takeover.log" 2>&1 &
w3=$!
sleep "$TAKEOVER_SECS"
kill "$w3"; wait "$w3" 2>/dev/null || true

# ceiling_run NAME ARGS…: tools/bench/ceiling with ARGS, its output in
# NAME.txt; every process's CPU and Postgres' counts are read over the
# tool's own window (its "window start" and "window end" lines), not its
# setup, warm-up and teardown, as its records are counted.
ceiling_run() {
  local name=$1 cpid; shift
  echo "$W/ceiling -kafka $KAFKA -pg $PG $*" >> "$R/commands.txt"
  "$W/ceiling" -kafka "$KAFKA" -pg "$PG" "$@" > "$R/$name.txt" 2> "$L/$name.log" &
  cpid=$!
  PIDS+=("$cpid")
  until grep -q "window start" "$L/$name.log" 2>/dev/null || ! kill -0 "$cpid" 2>/dev/null; do sleep 0.05; done
  snap "$R/cpu/$name.send"; pgstat "$R/pgstat/$name.send"
  until grep -q "window end" "$L/$name.log" 2>/dev/null || ! kill -0 "$cpid" 2>/dev/null; do sleep 0.05; done
  snap "$R/cpu/$name.end"; pgstat "$R/pgstat/$name.end"
  wait "$cpid" || log "$name failed (see $L/$name.log)"
  unset 'PIDS[${#PIDS[@]}-1]' # (the ceiling, added last)
}

log "ceiling: bare pipeline, $CEIL_PRODUCERS producers × $CEIL_BATCH records per transaction → read_committed consumer → Postgres, ${CEIL_SECS}s"
ceiling_run ceiling -producers "$CEIL_PRODUCERS" -batch "$CEIL_BATCH" -duration "${CEIL_SECS}s"

# The same bare parts in the shape a light load gives the writers: a
# producer per vshard, one record per transaction, paced at lat1000's rate.
vshards=$(jq -r .vshards "$EP")
log "ceiling1000: bare pipeline paced at 1,000 records/s, $vshards producers × 1 record per transaction, ${CEIL_SECS}s"
ceiling_run ceiling1000 -producers "$vshards" -batch 1 -rate 1000 -duration "${CEIL_SECS}s"

if [ "$GOBENCH" = 1 ]; then
  log "go test -bench: produce and Postgres-write ceilings on the same broker and Postgres"
  batch=$(go run ./tools/bench/report -batch "$R/metrics/saturation")
  echo "BENCH_KAFKA=$KAFKA BENCH_PG=$PG BENCH_PRODUCERS=$vshards BENCH_BATCH=$batch go test ./tools/bench -run '^\$' -bench . -benchtime $BENCHTIME" >> "$R/commands.txt"
  BENCH_KAFKA=$KAFKA BENCH_PG=$PG BENCH_PRODUCERS=$vshards BENCH_BATCH=$batch \
    go test ./tools/bench -run '^$' -bench . -benchtime "$BENCHTIME" > "$R/bench.txt" 2>&1 || log "go test -bench failed (see $R/bench.txt)"
fi
stop_all

# The write floor runs with the stack stopped, so that nothing else of it
# shares the cores.
for b in 1 "$FLOOR_BATCH"; do
  log "floor: loopback writes of one event frame to $FLOOR_CONNS connections, $FLOOR_RATE frames/s, $b per write, ${FLOOR_SECS}s"
  echo "$W/floor -conns $FLOOR_CONNS -rate $FLOOR_RATE -batch $b -duration ${FLOOR_SECS}s" >> "$R/commands.txt"
  "$W/floor" -conns "$FLOOR_CONNS" -rate "$FLOOR_RATE" -batch "$b" -duration "${FLOOR_SECS}s" \
    > "$R/floor-$b.txt" 2> "$L/floor-$b.log" || log "floor failed (see $L/floor-$b.log)"
done
log "floor: a bare websocket server, one message per frame to $FLOOR_CONNS connections, $FLOOR_RATE frames/s, ${FLOOR_SECS}s"
echo "$W/floor -ws -conns $FLOOR_CONNS -rate $FLOOR_RATE -duration ${FLOOR_SECS}s" >> "$R/commands.txt"
"$W/floor" -ws -conns "$FLOOR_CONNS" -rate "$FLOOR_RATE" -duration "${FLOOR_SECS}s" \
  > "$R/floor-ws.txt" 2> "$L/floor-ws.log" || log "websocket floor failed (see $L/floor-ws.log)"
# Goal 7's anchor for lat1000 and r3000: the same bare server in each run's
# shape, its devices and the event frames a second the gateway wrote to them.
for run in lat1000 r3000; do
  rm -f "$R/floor-ws-$run.txt" # (an earlier run's, in a BENCH_DIR used again)
  shape=$(go run ./tools/bench/report -dir "$R" -shape "$run" 2> "$L/floor-ws-$run.log") || { log "websocket floor in $run's shape: not measured (see $L/floor-ws-$run.log)"; continue; }
  read -r conns rate <<< "$shape"
  log "floor: a bare websocket server in $run's shape, $conns connections, $rate frames/s, ${FLOOR_SECS}s"
  echo "$W/floor -ws -conns $conns -rate $rate -duration ${FLOOR_SECS}s" >> "$R/commands.txt"
  "$W/floor" -ws -conns "$conns" -rate "$rate" -duration "${FLOOR_SECS}s" \
    > "$R/floor-ws-$run.txt" 2>> "$L/floor-ws-$run.log" || log "websocket floor in $run's shape failed (see $L/floor-ws-$run.log)"
done

if [ "$SWEEP" = 1 ]; then
  # Each row a fresh all-in-one stack (`chatpipe dev` with its roles in it):
  # the rows compare with one another, not with the figures above.
  log "trade-off: vshards × linger budget at 1,000 msg/s (--txn-budget $SWEEP_BUDGET)"
  echo "$SWEEP_BUDGET" > "$R/sweep-budget.txt"
  : > "$R/sweep.txt"
  for v in $SWEEP_VSHARDS; do
    for l in $SWEEP_LINGERS; do
      name=sweep-$v-${l/-1ms/off}
      d=$W/$name
      rm -rf "$d"; mkdir -p "$d"
      NAMES=() PPIDS=() ADMINS=() PM=
      echo "$BIN kafka --data-dir $d/kafka --port 0 --partitions 10 --admin 127.0.0.1:0" >> "$R/commands.txt"
      "$BIN" kafka --data-dir "$d/kafka" --port 0 --partitions 10 --admin 127.0.0.1:0 --log-level info > "$d/kafka.out" 2> "$d/kafka.log" &
      PIDS+=($!); kpid=$!
      KAFKA=$(wait_for "$d/kafka.out" 's/^\(127\.0\.0\.1:[0-9]*\)$/\1/p')
      add_proc broker "$kpid" ""
      echo "$BIN dev --data-dir $d/dev --kafka $KAFKA --rate-user -1 --rate-conv -1 --vshards $v --linger-max $l --txn-budget $SWEEP_BUDGET" >> "$R/commands.txt"
      "$BIN" dev --data-dir "$d/dev" --kafka "$KAFKA" --http 127.0.0.1:0 "${NOLIMIT[@]}" --log-level warn \
        --vshards "$v" --linger-max "$l" --txn-budget "$SWEEP_BUDGET" > "$d/dev.log" 2>&1 &
      PIDS+=($!); dpid=$!
      for _ in $(seq 1 600); do [ -f "$d/dev/endpoints.json" ] && break; sleep 0.2; done
      SEP=$d/dev/endpoints.json DATA=$d/dev PG=$(jq -r .postgres "$SEP")
      a=$(jq -r .admin "$SEP"); add_proc dev "$dpid" "${a#http://}"
      # (the workers' counters are in dev's metrics here)
      NAMES+=(w1); PPIDS+=(0); ADMINS+=("${a#http://}")
      PM=$(head -1 "$d/dev/postgres/postmaster.pid" 2>/dev/null || echo)
      "$BIN" loadgen --endpoints "$SEP" --out "$W/warmup" --run "warmup-$name" --progress=false --rate 300 --duration 5s > "$d/warmup.out" 2>&1 || true
      psql -q "$PG" -c ANALYZE
      measured "$name" --rate 1000 --duration "${SWEEP_SECS}s"
      echo "$v $l $name" >> "$R/sweep.txt"
      stop_all
    done
  done
fi

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$R/machine.txt"
go run ./tools/bench/report -dir "$R" -out "$OUT"
# The soak (tools/bench/soak.sh, 30 minutes) is not run here: its last result is
# kept in tools/bench/soak/soak.md and appended as it stands.
if [ -f tools/bench/soak/soak.md ]; then
  { echo; cat tools/bench/soak/soak.md; } >> "$OUT"
fi
# Nor is the hot-conversation benchmark (tools/bench/hot.sh): its last result is
# kept in tools/bench/hot/hot.md and appended as it stands.
if [ -f tools/bench/hot/hot.md ]; then
  { echo; cat tools/bench/hot/hot.md; } >> "$OUT"
fi
log "wrote $OUT"
