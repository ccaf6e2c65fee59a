#!/usr/bin/env bash
# Soak benchmark: chatpipe as separate role processes on this machine under
# a moderate, steady peak-mix load with membership churn and reconnects,
# sampling every process's RSS and goroutine count, to show whether memory
# and goroutines plateau.
#
# Processes: a standalone broker (`chatpipe kafka`), `chatpipe dev` with its
# in-process roles off (it hosts etcd and a private Postgres; its own
# gateway stays idle), and separate `chatpipe gateway`, `chatpipe worker`
# ×2 and `chatpipe persist` (the events and the read model) on its
# endpoints.json.
# `chatpipe loadgen` drives the separate gateway; afterwards `chatpipe check`
# verifies the run against the log and Postgres.
#
# Knobs (environment):
#   SOAK_SECS=1800         length of the send phase
#   SOAK_SAMPLE=60         seconds between samples
#   SOAK_RATE=800          offered msg/s (peak profile mix)
#   SOAK_CHURN=2           membership changes/s (leave/kick, probe, re-add)
#   SOAK_RECONNECTS=1      deliberate reconnects/s (a device drops and redials)
#   SOAK_LOADGEN_ARGS=     more loadgen flags, e.g. --plain-frames
#   SOAK_POISON=0          1: hostile frames over a websocket every SOAK_POISON_EVERY
#   SOAK_POISON_EVERY=60s
#   SOAK_DIR               work dir (default: a new /tmp/chatpipe-soak.XXXXXX)
#   RESULTS                results dir (default: $SOAK_DIR/results)
#
# Output in $RESULTS: samples.tsv (minute, process, rss_kib, goroutines),
# table.md, soak.svg, soak.md (a section ready for BENCHMARKS.md), check.txt,
# the loadgen run under runs/soak, poison.tsv (with SOAK_POISON=1), logs/.
#
# Plateau rule: every process's samples of the last 10 minutes are within
# 10 % of its minute-10 value (RSS and goroutines). A run shorter than 30
# minutes uses a third of its length instead of 10 minutes: the reference
# sample is at 1/3 of the run and the window is the last third.
set -euo pipefail
cd "$(dirname "$0")/../.."
SOAK_SECS=${SOAK_SECS:-1800}
SOAK_SAMPLE=${SOAK_SAMPLE:-60}
SOAK_RATE=${SOAK_RATE:-800}
SOAK_CHURN=${SOAK_CHURN:-2}
SOAK_RECONNECTS=${SOAK_RECONNECTS:-1}
SOAK_POISON=${SOAK_POISON:-0}
SOAK_POISON_EVERY=${SOAK_POISON_EVERY:-60s}
W=${SOAK_DIR:-$(mktemp -d /tmp/chatpipe-soak.XXXXXX)}
RESULTS=${RESULTS:-$W/results}
W=$(cd "$W" && pwd)
mkdir -p "$RESULTS/logs"
RESULTS=$(cd "$RESULTS" && pwd)
L=$RESULTS/logs
BIN=$W/chatpipe

log() { echo "soak: $(date -u +%H:%M:%S) $*" >&2; }

# Every process started here, in start order; stopped in reverse on exit.
PIDS=()
stop_all() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true
  done
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  PIDS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM

log "building into $W"
go build -o "$BIN" ./cmd/chatpipe
go build -o "$W/poison" ./tools/bench/poison
go build -o "$W/soakreport" ./tools/bench/soakreport

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

# Process table: name, pid, metrics URL ("" if none).
NAMES=() PPIDS=() URLS=()
add_proc() { NAMES+=("$1"); PPIDS+=("$2"); URLS+=("$3"); }

log "broker"
# 10 partitions: dev's 8 for the hashed vshards and one for each of its 2
# dedicated vshards (dev refuses a topic of another shape).
"$BIN" kafka --data-dir "$W/kafka" --port 0 --partitions 10 --admin 127.0.0.1:0 --log-level info > "$L/kafka.out" 2> "$L/kafka.log" &
PIDS+=($!); KAFKA_PID=$!
KAFKA=$(wait_for "$L/kafka.out" 's/^\(127\.0\.0\.1:[0-9]*\)$/\1/p')
KAFKA_ADMIN=$(wait_for "$L/kafka.log" 's/.*kafka admin listening.* admin=\([0-9.:]*\).*/\1/p')
add_proc kafka "$KAFKA_PID" "http://$KAFKA_ADMIN/metrics"

log "dev (etcd, Postgres; no workers or persist in it)"
"$BIN" dev --data-dir "$W/dev" --kafka "$KAFKA" --http 127.0.0.1:0 --workers 0 --persist=false \
  --log-level warn > "$L/dev.out" 2> "$L/dev.log" &
PIDS+=($!); DEV_PID=$!
for _ in $(seq 1 600); do [ -f "$W/dev/endpoints.json" ] && break; sleep 0.2; done
EP=$W/dev/endpoints.json
[ -f "$EP" ] || { log "dev did not write endpoints.json"; tail -20 "$L/dev.log" >&2; exit 1; }
PG=$(jq -r .postgres "$EP")
add_proc dev "$DEV_PID" "$(jq -r .metrics "$EP")"

start_role() { # NAME LOG-PATTERN ARGS…
  local name=$1 pat=$2; shift 2
  "$BIN" "$@" --endpoints "$EP" --log-level info > "$L/$name.out" 2> "$L/$name.log" &
  PIDS+=($!)
  local pid=$! addr
  addr=$(wait_for "$L/$name.log" "$pat")
  add_proc "$name" "$pid" "http://$addr/metrics"
}
log "roles: persist, worker ×2, gateway"
start_role persist 's/.*persist starting.* admin=\([0-9.:]*\).*/\1/p' persist
start_role w1 's/.*worker starting.* admin=\([0-9.:]*\).*/\1/p' worker --id w1
start_role w2 's/.*worker starting.* admin=\([0-9.:]*\).*/\1/p' worker --id w2
# --metrics-public: the soak samples the gateway's /metrics on the address
# it also serves the websocket on (the gateway's default keeps it on --admin).
start_role gateway 's/.*gateway listening.* addr=\([0-9.:]*\).*/\1/p' gateway --http 127.0.0.1:0 --data-dir "$W/dev" --metrics-public
GW=${URLS[${#URLS[@]} - 1]%/metrics}
GW=${GW#http://}
for _ in $(seq 1 300); do curl -sf "http://$GW/readyz" > /dev/null && break; sleep 0.2; done
# loadgen and poison talk to the separate gateway: its own endpoints file.
SEP=$W/soak-endpoints.json
jq --arg gw "$GW" '.websocket = "ws://\($gw)/v1/ws" | .http = "http://\($gw)" | .metrics = "http://\($gw)/metrics"' "$EP" > "$SEP"

PM=$(head -1 "$W/dev/postgres/postmaster.pid" 2>/dev/null || echo)

# Warm up (every vshard gets its writer, the tables exist), then ANALYZE:
# see docs/loadgen.md, "A fresh stack".
log "warm-up"
"$BIN" loadgen --endpoints "$SEP" --data-dir "$W/dev" --out "$W/warmup" --run warmup --progress=false --rate 200 --duration 5s \
  > "$L/warmup.out" 2>&1 || log "warm-up loadgen failed (see $L/warmup.out)"
psql -q "$PG" -c ANALYZE

# sample MINUTE: one line per process into samples.tsv. Postgres is its
# postmaster and children: the sum of their Pss (proportional set size, so
# shared buffers count once); it has no goroutines.
sample() {
  local m=$1 i pid rss g
  for i in "${!NAMES[@]}"; do
    pid=${PPIDS[i]}
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    g=
    [ -n "${URLS[i]}" ] && g=$(curl -s -m 5 "${URLS[i]}" 2>/dev/null | awk '$1 == "go_goroutines" {print $2}' || true)
    printf '%s\t%s\t%s\t%s\n' "$m" "${NAMES[i]}" "${rss:--}" "${g:--}"
  done
  if [ -n "$PM" ] && [ -d "/proc/$PM" ]; then
    # (backends come and go: one that ended between pgrep and awk is skipped)
    rss=$(for p in $PM $(pgrep -P "$PM" 2>/dev/null || true); do awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || true; done | awk '{s += $1} END {print s + 0}')
    printf '%s\tpostgres\t%s\t-\n' "$m" "$rss"
  fi
}

sampler() { # every SOAK_SAMPLE s from now until SOAK_SECS
  local t0 k=0 now d sp=
  trap '[ -n "$sp" ] && kill "$sp" 2>/dev/null; exit 0' TERM
  t0=$(date +%s.%N)
  while :; do
    # (|| keeps one failed probe from ending the sampler under set -e)
    sample "$(awk -v s=$((k * SOAK_SAMPLE)) 'BEGIN {printf "%.2f", s / 60}')" >> "$RESULTS/samples.tsv" || log "a sample failed"
    k=$((k + 1))
    [ $((k * SOAK_SAMPLE)) -gt "$SOAK_SECS" ] && break
    now=$(date +%s.%N)
    d=$(awk -v a="$t0" -v b="$now" -v o=$((k * SOAK_SAMPLE)) 'BEGIN {d = a + o - b; print (d > 0 ? d : 0)}')
    sleep "$d" & sp=$!
    wait "$sp" || true
    sp=
  done
}

printf 'minute\tprocess\trss_kib\tgoroutines\n' > "$RESULTS/samples.tsv"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "go: $(go version | cut -d' ' -f3-)"
  echo "load average at start (other work on the machine): $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$RESULTS/machine.txt"

LG_ARGS=(loadgen --endpoints "$SEP" --data-dir "$W/dev" --out "$RESULTS/runs" --run soak --progress=false
  --profile peak --rate "$SOAK_RATE" --duration "${SOAK_SECS}s" --churn "$SOAK_CHURN" --reconnects "$SOAK_RECONNECTS")
# SOAK_LOADGEN_ARGS: more loadgen flags (e.g. --plain-frames).
read -r -a extra <<< "${SOAK_LOADGEN_ARGS:-}"
LG_ARGS+=("${extra[@]}")
echo "chatpipe ${LG_ARGS[*]}" > "$RESULTS/commands.txt"
log "load: ${SOAK_RATE} msg/s for ${SOAK_SECS}s, churn ${SOAK_CHURN}/s, reconnects ${SOAK_RECONNECTS}/s, sample every ${SOAK_SAMPLE}s (results in $RESULTS)"
"$BIN" "${LG_ARGS[@]}" > "$RESULTS/loadgen.out" 2> "$L/loadgen.log" &
PIDS+=($!); LG_PID=$!
sampler &
PIDS+=($!); SAMPLER_PID=$!
POISON_PID=
if [ "$SOAK_POISON" = 1 ]; then
  echo "poison -endpoints $SEP -every $SOAK_POISON_EVERY" >> "$RESULTS/commands.txt"
  "$W/poison" -endpoints "$SEP" -data-dir "$W/dev" -every "$SOAK_POISON_EVERY" -out "$RESULTS/poison.tsv" 2> "$L/poison.log" &
  PIDS+=($!); POISON_PID=$!
fi
LG_RC=0
wait "$LG_PID" || LG_RC=$?
log "loadgen exited $LG_RC"
[ -n "$POISON_PID" ] && { kill "$POISON_PID" 2>/dev/null || true; wait "$POISON_PID" 2>/dev/null || true; }
# The sampler ends by itself after SOAK_SECS; a loadgen that ended early
# ends it too.
kill "$SAMPLER_PID" 2>/dev/null || true
wait "$SAMPLER_PID" 2>/dev/null || true

log "check"
echo "chatpipe check --run $RESULTS/runs/soak" >> "$RESULTS/commands.txt"
CHECK_RC=0
"$BIN" check --run "$RESULTS/runs/soak" > "$RESULTS/check.txt" 2>&1 || CHECK_RC=$?
if [ -n "$(psql -tAq "$PG" -c "select to_regclass('dead_letters')" 2>/dev/null)" ]; then
  DEAD=$(psql -tAq "$PG" -c "select count(*) from dead_letters" 2>/dev/null || echo "unreadable")
else
  DEAD="no dead_letters table"
fi
echo "$DEAD" > "$RESULTS/dead_letters.txt"

"$W/soakreport" -samples "$RESULTS/samples.tsv" -secs "$SOAK_SECS" -svg "$RESULTS/soak.svg" > "$RESULTS/table.md"

lg_row() { # the value of a row of loadgen's report.md
  awk -v k="| $1 | " 'index($0, k) == 1 {v = substr($0, length(k) + 1); sub(/ \|$/, "", v); print v; exit}' "$RESULTS/runs/soak/report.md" 2>/dev/null || true
}
{
  echo "## Soak: ${SOAK_RATE} msg/s for $((SOAK_SECS / 60)) min, roles as separate processes"
  echo
  echo "\`tools/bench/soak.sh\` (SOAK_SECS=$SOAK_SECS SOAK_SAMPLE=$SOAK_SAMPLE SOAK_RATE=$SOAK_RATE SOAK_CHURN=$SOAK_CHURN" \
    "SOAK_RECONNECTS=$SOAK_RECONNECTS SOAK_POISON=$SOAK_POISON), $(sed -n 's/^date: //p' "$RESULTS/machine.txt")," \
    "commit $(sed -n 's/^commit: //p' "$RESULTS/machine.txt"); $(sed -n 's/^cpu: //p' "$RESULTS/machine.txt"), shared by every process" \
    "(broker, etcd + Postgres in \`chatpipe dev\`, gateway, 2 workers, persist, loadgen)."
  echo
  echo "Load: peak profile mix, open loop; membership churn ${SOAK_CHURN}/s, ${SOAK_RECONNECTS} deliberate reconnects/s."
  for k in "sent / accepted" "accepted/s (run), best second" "accepted latency p50 / p90 / p99 / p99.9 / max" \
    "delivery latency p50 / p90 / p99 / p99.9 / max" "membership changes" "final rejections" "errors, reconnects, unanswered"; do
    v=$(lg_row "$k"); [ -n "$v" ] && echo "- $k: $v"
  done
  [ "$LG_RC" = 0 ] || echo "- loadgen exited $LG_RC (see loadgen.out)"
  echo
  echo "Samples every ${SOAK_SAMPLE} s: RSS from /proc/PID/status (Postgres: the Pss sum of the postmaster and its backends)," \
    "goroutines from each process's /metrics (\`go_goroutines\`). \`dev\` holds etcd and an idle gateway."
  echo
  cat "$RESULTS/table.md"
  echo
  echo "![RSS and goroutines over time](soak.svg)"
  echo
  if [ "$CHECK_RC" = 0 ]; then
    echo "\`chatpipe check\`: passed ($(sed -n 's/^  \([a-z][a-z ]*[a-z]\)  *\([0-9][0-9]*\)$/\1 \2/p' "$RESULTS/check.txt" | paste -sd, - | sed 's/,/, /g'))."
  else
    echo "\`chatpipe check\`: **failed** (exit $CHECK_RC):"
    echo
    echo '```'
    head -20 "$RESULTS/check.txt"
    echo '```'
  fi
  echo
  echo "Dead letters: $DEAD."
  if [ "$SOAK_POISON" = 1 ] && [ -f "$RESULTS/poison.tsv" ]; then
    echo
    echo "Poison frames (every $SOAK_POISON_EVERY; answer: rounds):"
    echo
    echo "| frame | answers |"
    echo "|---|---|"
    awk -F'\t' 'NR > 1 {a = $4; sub(/seq [0-9]+/, "seq N", a); c[$3 "\t" a]++; if (!($3 in o)) {o[$3] = ++n; f[n] = $3}}
      END {for (i = 1; i <= n; i++) {s = ""; for (k in c) {split(k, p, "\t"); if (p[1] == f[i]) s = s (s ? "; " : "") p[2] ": " c[k]}; print "| " f[i] " | " s " |"}}' "$RESULTS/poison.tsv"
  fi
} > "$RESULTS/soak.md"

stop_all
cat "$RESULTS/soak.md"
log "wrote $RESULTS/soak.md"
