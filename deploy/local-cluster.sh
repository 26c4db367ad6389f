#!/usr/bin/env bash
# A whole Encore cluster on one machine, on free loopback ports: one redis-server (with
# deploy/redis.conf), 3 `encore serve` replicas sharing it, and HAProxy running
# deploy/haproxy.cfg itself (its addresses come from environment variables, so the test
# exercises the shipped file, not a copy).
#
#   deploy/local-cluster.sh start MODEL DIR   start everything; DIR keeps pids, ports, logs,
#                                             each replica's --state-dir and DIR/env
#   deploy/local-cluster.sh stop DIR          stop everything started in DIR
#   deploy/local-cluster.sh kill DIR N        SIGKILL replica N (1..3)
#   deploy/local-cluster.sh restart DIR N     SIGTERM replica N, wait for it to exit, start it
#                                             again on the same port, wait until it serves
#   deploy/local-cluster.sh status DIR        what runs, and HAProxy's view of the replicas
#   deploy/local-cluster.sh redis-stop DIR    stop Redis (an outage: the replicas go on)
#   deploy/local-cluster.sh redis-start DIR   start it again on the same port (what its AOF kept)
#
# Environment: ENCORE_BIN (default: `encore` on PATH, else build/bin/encore),
# ENCORE_SERVE_ARGS (extra `encore serve` flags for every replica, word-split),
# HAPROXY_BIN (default: `haproxy` on PATH, else /usr/sbin/haproxy).
#
# DIR/env (shell syntax): LB_URL, LB_PORT, REDIS_PORT, REDIS_URL, REPLICA_PORT_1..3,
# STATS_SOCKET, MODEL, and the ENCORE_BIN and ENCORE_SERVE_ARGS of `start`, which
# `restart` uses again. Everything listens on 127.0.0.1 only.
set -euo pipefail

readonly REPLICAS=3
DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$DEPLOY_DIR")"
readonly DEPLOY_DIR REPO_DIR
readonly START_TIMEOUT=60 # seconds for the model to load and HAProxy to see a replica UP
readonly STOP_TIMEOUT=40  # seconds a SIGTERMed process gets before SIGKILL (> shutdown grace)

die() {
  echo "local-cluster: $*" >&2
  exit 1
}
log() { echo "local-cluster: $(date +%T.%3N) $*" >&2; }

find_encore() {
  if [ -n "${ENCORE_BIN:-}" ]; then
    echo "$ENCORE_BIN"
  elif command -v encore >/dev/null; then
    command -v encore
  elif [ -x "$REPO_DIR/build/bin/encore" ]; then
    echo "$REPO_DIR/build/bin/encore"
  else
    die "no encore binary: set ENCORE_BIN or build build/bin/encore"
  fi
}

find_haproxy() {
  if [ -n "${HAPROXY_BIN:-}" ]; then
    echo "$HAPROXY_BIN"
  elif command -v haproxy >/dev/null; then
    command -v haproxy
  elif [ -x /usr/sbin/haproxy ]; then
    echo /usr/sbin/haproxy
  else
    die "haproxy not found (scripts/setup.sh installs it)"
  fi
}

# N free loopback ports, all bound at once so that they differ. Another process may still
# take one before we bind it; the start then fails loudly rather than silently.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# The pid in FILE if that process is still alive.
live_pid() {
  local f=$1 pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# SIGTERM (or $2) the process in pid file $1, wait up to STOP_TIMEOUT, then SIGKILL.
stop_pidfile() {
  local f=$1 sig=${2:-TERM} pid i
  pid=$(live_pid "$f") || {
    rm -f "$f"
    return 0
  }
  kill -"$sig" "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$(basename "$f" .pid) (pid $pid) still running after ${STOP_TIMEOUT}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$f"
}

# HTTP status of GET URL ("000" when nothing answers); stdlib only.
http_status() {
  python3 - "$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=2).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("000")
PY
}

# HAProxy's view: "NAME STATUS LAST_CHECK" per replica, from `show stat` on the socket.
haproxy_servers() {
  python3 - "$1" <<'PY'
import csv, io, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
s.connect(sys.argv[1])
s.sendall(b"show stat\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
for r in rows:
    if r["pxname"] == "encore_replicas" and r["svname"] not in ("BACKEND", "FRONTEND"):
        print(r["svname"], r["status"], r["check_status"] or "-")
PY
}

# Until HAProxy marks replica N UP after a passing check (bounded).
wait_haproxy_up() {
  local dir=$1 n=$2 i
  for ((i = 0; i < START_TIMEOUT * 5; i++)); do
    if haproxy_servers "$dir/haproxy.sock" 2>/dev/null | grep -q "^r$n UP L7OK$"; then
      return 0
    fi
    sleep 0.2
  done
  die "HAProxy did not mark r$n UP within ${START_TIMEOUT}s: $(haproxy_servers "$dir/haproxy.sock" 2>&1 | tr '\n' ';')"
}

# Until replica N answers /health with 200 (bounded); fails at once if it exited.
wait_replica_healthy() {
  local dir=$1 n=$2 port=$3 i
  for ((i = 0; i < START_TIMEOUT * 5; i++)); do
    live_pid "$dir/r$n/encore.pid" >/dev/null || die "replica $n exited at start: $(tail -n 5 "$dir/r$n/encore.log")"
    [ "$(http_status "http://127.0.0.1:$port/health")" = 200 ] && return 0
    sleep 0.2
  done
  die "replica $n not healthy within ${START_TIMEOUT}s (log: $dir/r$n/encore.log)"
}

start_redis() {
  local dir=$1 port=$2 i
  mkdir -p "$dir/redis"
  # The shipped fragment, with what differs on loopback given after it (later wins).
  redis-server "$DEPLOY_DIR/redis.conf" --port "$port" --bind 127.0.0.1 --dir "$dir/redis" \
    --daemonize no --logfile "$dir/redis/redis.log" --maxmemory 2gb \
    </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/redis.pid"
  for ((i = 0; i < 100; i++)); do
    [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && return 0
    live_pid "$dir/redis.pid" >/dev/null || die "redis-server exited at start: $(tail -n 5 "$dir/redis/redis.log")"
    sleep 0.1
  done
  die "redis-server did not answer PING within 10 s"
}

start_replica() {
  local dir=$1 n=$2
  # shellcheck source=/dev/null
  source "$dir/env"
  local port_var="REPLICA_PORT_$n"
  local port=${!port_var}
  mkdir -p "$dir/r$n/state"
  # --max-connections-per-ip 0: every request comes from HAProxy's one address.
  # --idle-timeout 60: HAProxy closes idle connections first (deploy/encore.service).
  # shellcheck disable=SC2086,SC2153  # ENCORE_SERVE_ARGS: a list of flags; MODEL: from env
  "$ENCORE_BIN" serve -m "$MODEL" --host 127.0.0.1 --port "$port" \
    --state-dir "$dir/r$n/state" --redis "$REDIS_URL" --max-connections-per-ip 0 --idle-timeout 60 \
    ${ENCORE_SERVE_ARGS:-} </dev/null >>"$dir/r$n/encore.log" 2>&1 &
  echo $! >"$dir/r$n/encore.pid"
  wait_replica_healthy "$dir" "$n" "$port"
}

start_haproxy() {
  local dir=$1
  # shellcheck source=/dev/null
  source "$dir/env"
  local hap
  hap=$(find_haproxy)
  export ENCORE_LB_BIND="127.0.0.1:$LB_PORT" ENCORE_LB_STATS_SOCKET="$STATS_SOCKET" \
    ENCORE_LB_LOG=stdout ENCORE_REPLICA_1="127.0.0.1:$REPLICA_PORT_1" \
    ENCORE_REPLICA_2="127.0.0.1:$REPLICA_PORT_2" ENCORE_REPLICA_3="127.0.0.1:$REPLICA_PORT_3"
  "$hap" -c -q -f "$DEPLOY_DIR/haproxy.cfg" || die "deploy/haproxy.cfg does not validate"
  # -db: stay in the foreground (we hold its pid); its log lines go to haproxy.log.
  "$hap" -db -f "$DEPLOY_DIR/haproxy.cfg" </dev/null >>"$dir/haproxy.log" 2>&1 &
  echo $! >"$dir/haproxy.pid"
}

cmd_start() {
  local model=$1 dir=$2 n
  [ -f "$model" ] || die "no model at $model"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
  for f in "$dir"/haproxy.pid "$dir"/redis.pid "$dir"/r*/encore.pid; do
    live_pid "$f" >/dev/null && die "$dir already runs a cluster (stop it first)"
  done
  command -v redis-server >/dev/null || die "redis-server not found (scripts/setup.sh installs it)"
  find_haproxy >/dev/null
  local encore
  encore=$(find_encore)
  [ -x "$encore" ] || encore=$(command -v "$encore") || die "ENCORE_BIN $encore is not executable"

  # Never leave half a cluster behind: any failure from here on (die, set -e, a signal)
  # exits, and the exit stops what started.
  START_DIR=$dir
  START_OK=0
  trap on_start_exit EXIT
  trap 'exit 1' INT TERM HUP

  local ports
  read -r -a ports <<<"$(free_ports $((REPLICAS + 2)))"
  cat >"$dir/env" <<EOF
MODEL=$model
REDIS_PORT=${ports[0]}
REDIS_URL=redis://127.0.0.1:${ports[0]}/0
LB_PORT=${ports[1]}
LB_URL=http://127.0.0.1:${ports[1]}
REPLICA_PORT_1=${ports[2]}
REPLICA_PORT_2=${ports[3]}
REPLICA_PORT_3=${ports[4]}
STATS_SOCKET=$dir/haproxy.sock
ENCORE_BIN=$(printf %q "$encore")
ENCORE_SERVE_ARGS=$(printf %q "${ENCORE_SERVE_ARGS:-}")
EOF
  start_redis "$dir" "${ports[0]}"
  for ((n = 1; n <= REPLICAS; n++)); do
    start_replica "$dir" "$n"
  done
  start_haproxy "$dir"
  for ((n = 1; n <= REPLICAS; n++)); do
    wait_haproxy_up "$dir" "$n"
  done
  START_OK=1
  log "up: balancer http://127.0.0.1:${ports[1]}, replicas ${ports[2]} ${ports[3]} ${ports[4]}, redis ${ports[0]} (DIR/env)"
}

on_start_exit() {
  if [ "$START_OK" != 1 ]; then
    log "start failed; stopping what started"
    cmd_stop "$START_DIR"
  fi
}

cmd_stop() {
  local dir=$1 n stoppers=()
  [ -d "$dir" ] || die "no cluster directory $dir"
  # The balancer first (no new requests), then the replicas together (each drains), then
  # Redis last (the replicas write their sessions to it while they drain).
  stop_pidfile "$dir/haproxy.pid"
  for ((n = 1; n <= REPLICAS; n++)); do
    stop_pidfile "$dir/r$n/encore.pid" &
    stoppers+=($!)
  done
  # Only the stoppers: the shell that started the cluster also has the servers as children.
  wait "${stoppers[@]}"
  stop_pidfile "$dir/redis.pid"
  rm -f "$dir/haproxy.sock"
}

check_n() {
  if ! [[ "$1" =~ ^[1-9][0-9]*$ ]] || (("$1" > REPLICAS)); then
    die "replica number must be 1..$REPLICAS, not '$1'"
  fi
}

cmd_kill() {
  local dir=$1 n=$2
  check_n "$n"
  live_pid "$dir/r$n/encore.pid" >/dev/null || die "replica $n is not running"
  stop_pidfile "$dir/r$n/encore.pid" KILL
  log "replica $n killed (SIGKILL)"
}

cmd_restart() {
  local dir=$1 n=$2
  check_n "$n"
  [ -f "$dir/env" ] || die "no cluster in $dir"
  # SIGTERM drains: /health turns 503 (HAProxy stops sending), requests that came in
  # meanwhile get a 503 that HAProxy retries elsewhere, in-flight ones finish, sessions
  # are written; then the process exits.
  log "replica $n: SIGTERM"
  stop_pidfile "$dir/r$n/encore.pid"
  log "replica $n: exited; starting it again"
  start_replica "$dir" "$n"
  log "replica $n: /health ok"
  # Back in the rotation before returning, so that a rolling restart never has two
  # replicas out at once.
  [ -S "$dir/haproxy.sock" ] && wait_haproxy_up "$dir" "$n"
  log "replica $n restarted (HAProxy: UP)"
}

cmd_redis_stop() {
  local dir=$1
  [ -f "$dir/env" ] || die "no cluster in $dir"
  stop_pidfile "$dir/redis.pid"
  log "redis stopped"
}

cmd_redis_start() {
  local dir=$1
  [ -f "$dir/env" ] || die "no cluster in $dir"
  live_pid "$dir/redis.pid" >/dev/null && die "redis is already running"
  # shellcheck source=/dev/null
  source "$dir/env"
  start_redis "$dir" "$REDIS_PORT"
  log "redis started again on port $REDIS_PORT"
}

cmd_status() {
  local dir=$1 n pid
  [ -f "$dir/env" ] || die "no cluster in $dir"
  # shellcheck source=/dev/null
  source "$dir/env"
  pid=$(live_pid "$dir/redis.pid") && echo "redis    pid $pid port $REDIS_PORT" || echo "redis    down"
  for ((n = 1; n <= REPLICAS; n++)); do
    local port_var="REPLICA_PORT_$n"
    if pid=$(live_pid "$dir/r$n/encore.pid"); then
      echo "replica$n pid $pid port ${!port_var} health $(http_status "http://127.0.0.1:${!port_var}/health")"
    else
      echo "replica$n down (port ${!port_var})"
    fi
  done
  if pid=$(live_pid "$dir/haproxy.pid"); then
    echo "haproxy  pid $pid $LB_URL"
    haproxy_servers "$STATS_SOCKET" | sed 's/^/  /'
  else
    echo "haproxy  down"
  fi
}

usage() {
  # The header comment, up to the first line that is not one.
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}" >&2
  exit 2
}

main() {
  [ $# -ge 1 ] || usage
  local cmd=$1
  shift
  case "$cmd" in
    start) [ $# -eq 2 ] || usage && cmd_start "$1" "$2" ;;
    stop) [ $# -eq 1 ] || usage && cmd_stop "$1" ;;
    kill) [ $# -eq 2 ] || usage && cmd_kill "$1" "$2" ;;
    restart) [ $# -eq 2 ] || usage && cmd_restart "$1" "$2" ;;
    status) [ $# -eq 1 ] || usage && cmd_status "$1" ;;
    redis-stop) [ $# -eq 1 ] || usage && cmd_redis_stop "$1" ;;
    redis-start) [ $# -eq 1 ] || usage && cmd_redis_start "$1" ;;
    *) usage ;;
  esac
}

main "$@"
