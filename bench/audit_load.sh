#!/usr/bin/env bash
# The audit log's cost and checks under load (docs/audit.md, "Cost"):
#   1. throughput and the server's CPU per token without and with --audit-log, alternated
#      rounds (bench/load_test.py, 32 clients, no "alone" phase). On a shared VM the CPU per
#      token is the steadier number; the first run of a pair tends to be the faster;
#   2. --audit-log with --shadow-rate 1: mismatches from /metrics, then `encore replay`
#      of the log;
#   3. SIGKILL of the server under load: `encore audit verify`, then `encore replay`.
# Loopback only; every server is stopped at the end. Run on a quiet machine.
#
# usage: bench/audit_load.sh MODEL [ROUND_SECONDS] [ROUNDS] [THREADS] [PARTS]
#   PARTS: which of 1, 2, 3 to run (default 123)
set -euo pipefail
model=${1:?usage: audit_load.sh MODEL [ROUND_SECONDS] [ROUNDS] [THREADS] [PARTS]}
secs=${2:-30}
rounds=${3:-2}
threads=${4:-2}
parts=${5:-123}
here=$(cd "$(dirname "$0")/.." && pwd)
encore="$here/build/bin/encore"
work=$(mktemp -d "${TMPDIR:-/tmp}/encore-audit-load.XXXXXX")
port=$((20000 + RANDOM % 20000))
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; true' EXIT

start() {  # start ARGS...: a server on $port, ready
  "$encore" serve -m "$model" --port "$port" -t "$threads" --kv-mem 4096 "$@" \
    >>"$work/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    curl -sf "localhost:$port/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "the server did not start; see $work/serve.log" >&2
  exit 1
}
stop() { kill "$pid"; wait "$pid" || true; pid=""; }
cpu() { awk '{print ($14 + $15) / 100}' "/proc/$pid/stat"; }  # the server's CPU seconds
load() {  # load SECONDS: tokens/s, requests, failed, and the server's CPU ms per token
  local c0 r
  c0=$(cpu)
  r=$(python3 "$here/bench/load_test.py" --port "$port" --clients 32 --duration "$1" --no-alone \
    | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["tokens_per_s"], r["requests"], r["failed"], r["tokens_per_s"] * r["duration_s"])')
  echo "$r $(cpu) $c0" | awk '{printf "%s %s %s, server CPU %.2f ms/token\n", $1, $2, $3, 1000 * ($5 - $6) / $4}'
}

if [[ $parts == *1* ]]; then
echo "== 1. throughput without / with --audit-log ($rounds alternated rounds of $secs s)"
for r in $(seq "$rounds"); do
  start; echo "round $r, no audit log:  tok/s requests failed = $(load "$secs")"; stop
  start --audit-log "$work/a$r.log"
  echo "round $r, --audit-log:     tok/s requests failed = $(load "$secs")"; stop
done
fi

if [[ $parts == *2* ]]; then
echo "== 2. --audit-log --shadow-rate 1 ($((secs * 2)) s)"
start --audit-log "$work/shadow.log" --shadow-rate 1
load $((secs * 2)) | sed 's/^/tok\/s requests failed = /'
for _ in $(seq 600); do  # the checks still queued finish
  [ "$(curl -s "localhost:$port/metrics" | sed -n 's/^encore_consistency_pending //p')" = 0 ] && break
  sleep 0.5
done
curl -s "localhost:$port/metrics" | grep -E '^encore_consistency_(checks|mismatches|skipped)'
stop
"$encore" replay "$work/shadow.log" -m "$model" -t "$threads" --no-progress | tail -n 3
fi

if [[ $parts == *3* ]]; then
echo "== 3. SIGKILL under load"
start --audit-log "$work/killed.log" --audit-fsync always
python3 "$here/bench/load_test.py" --port "$port" --clients 32 --duration "$secs" --no-alone \
  >/dev/null 2>&1 &
loadpid=$!
sleep $((secs / 2))
kill -9 "$pid"; wait "$pid" 2>/dev/null || true; pid=""
wait "$loadpid" 2>/dev/null || true
"$encore" audit verify "$work/killed.log" || true
"$encore" replay "$work/killed.log" -m "$model" -t "$threads" --no-progress | tail -n 3
fi
echo "logs in $work"
