#!/usr/bin/env bash
# cluster.sh — N `turbine serve` replicas of one engine on loopback ports, nginx in front.
#
#   cluster.sh start --engine E --replicas N --port P [--dir D] [options] [-- turbine serve args]
#   cluster.sh stop   --dir D [--timeout S]
#   cluster.sh status --dir D
#
# Replica i (1..N) listens on 127.0.0.1:P+i with --threads T (default: the cores divided
# among the replicas); nginx listens on 127.0.0.1:P (--listen to change) with the
# configuration rendered from deploy/nginx/turbine.conf.template. Everything lives in D:
# cluster.env (the settings), nginx.conf, replica-I.pid, logs/replica-I.log, nginx.pid,
# logs/nginx_*.log, tmp/ (nginx's temp files). docs/DEPLOY.md describes it all.
#
# Steps used by scripts/rolling_restart.sh (and usable by hand):
#   cluster.sh mark --dir D --replica I down|up   nginx stops/starts sending it requests
#   cluster.sh stop-replica --dir D --replica I   SIGTERM (it drains), SIGKILL after --timeout
#   cluster.sh start-replica --dir D --replica I [--engine E]   start, wait for /health
#   cluster.sh reload --dir D                     render nginx.conf again, reload nginx
#
# The binary: $TURBINE_BIN, else `turbine` on PATH. nginx: $NGINX_BIN, else `nginx` on PATH,
# else /usr/sbin/nginx.
set -euo pipefail

SRC_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TEMPLATE="$SRC_DIR/deploy/nginx/turbine.conf.template"
TURBINE="${TURBINE_BIN:-turbine}"
# Debian installs nginx in /usr/sbin, which a user's PATH may lack
NGINX="${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}"

die() { echo "cluster.sh: $*" >&2; exit 2; }
say() { echo "cluster.sh: $*" >&2; }

usage() {
  sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<'EOF'

start options:
  --engine E               the engine file (omit, or 'demo', for the bundled demo model)
  --replicas N             replicas (default 2)
  --port P                 nginx's port; replica i gets P+i (default 8000)
  --dir D                  the cluster's folder (default ./turbine-cluster)
  --threads-per-replica T  each replica's --threads (default: cores / N, at least 1)
  --affinity header|none   header (default): X-Session-ID picks the replica by a
                           consistent hash; none: the --balance policy for all
  --balance least_conn|round_robin
                           requests without a session (all with --affinity none):
                           fewest connections (default) or in turn
  --listen ADDR:PORT       nginx's address (default 127.0.0.1:P)
  --edge-api-key KEY       nginx checks 'Authorization: Bearer KEY' (else pass-through:
                           give the replicas -- --api-key KEY)
  --max-body SIZE          nginx's client_max_body_size (default 1m, as the replicas)
  --rate-limit R           requests/s per client address at nginx (default 1000)
  --burst B                requests over the rate let through at once (default 2000)
  --max-fails N            passive health: failures within --fail-timeout that take a
                           replica out for --fail-timeout (default 3)
  --fail-timeout S         seconds (default 10)
  --read-timeout S         nginx's proxy_read_timeout (default 3600)
  --nginx-workers N        nginx worker processes (default 1)
  --start-timeout S        seconds to wait for each /health (default 120)
stop options:
  --timeout S              seconds SIGTERM has before SIGKILL (default 60)
EOF
}

# --- helpers -----------------------------------------------------------------------

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
need_uint() { is_uint "$2" || die "$1 needs a whole number, got '$2'"; }

# a process that runs (a zombie, killed but not yet reaped by its parent, does not)
alive() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null || return 1
  local st; st=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [ "$st" != Z ]
}

# http_code PORT PATH -> the status (000 when nothing answers)
http_code() {
  curl -s -o /dev/null -m 3 -w '%{http_code}' "http://127.0.0.1:$1$2" 2>/dev/null || true
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

state_file() { echo "$DIR/cluster.env"; }

save_state() {
  {
    echo "# cluster.sh state: sourced by cluster.sh and rolling_restart.sh"
    printf 'ENGINE=%q\nREPLICAS=%q\nPORT=%q\nTHREADS=%q\nAFFINITY=%q\nBALANCE=%q\nLISTEN=%q\n' \
      "$ENGINE" "$REPLICAS" "$PORT" "$THREADS" "$AFFINITY" "$BALANCE" "$LISTEN"
    printf 'EDGE_KEY=%q\nMAX_BODY=%q\nRATE=%q\nBURST=%q\nMAX_FAILS=%q\nFAIL_TIMEOUT=%q\n' \
      "$EDGE_KEY" "$MAX_BODY" "$RATE" "$BURST" "$MAX_FAILS" "$FAIL_TIMEOUT"
    printf 'READ_TIMEOUT=%q\nWORKERS=%q\nSTART_TIMEOUT=%q\n' "$READ_TIMEOUT" "$WORKERS" "$START_TIMEOUT"
    printf 'CLUSTER_TURBINE=%q\n' "$TURBINE"
    printf 'EXTRA=('; for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do printf ' %q' "$a"; done; printf ' )\n'
  } > "$DIR/cluster.env.tmp"
  mv "$DIR/cluster.env.tmp" "$DIR/cluster.env"
}

load_state() {
  [ -n "${DIR:-}" ] || die "--dir D is required"
  [ -f "$DIR/cluster.env" ] || die "$DIR holds no cluster (no cluster.env)"
  DIR="$(cd "$DIR" && pwd)"
  EXTRA=()
  # shellcheck disable=SC1090
  . "$DIR/cluster.env"
  # the binary the cluster started with, unless TURBINE_BIN names another
  [ -n "${TURBINE_BIN:-}" ] || TURBINE="${CLUSTER_TURBINE:-$TURBINE}"
}

edge_port() { echo "${LISTEN##*:}"; } # nginx's port (its /health is asked on 127.0.0.1)
replica_port() { echo $((PORT + $1)); }
replica_pid() { cat "$DIR/replica-$1.pid" 2>/dev/null || true; }
replica_engine() { if [ -f "$DIR/replica-$1.engine" ]; then cat "$DIR/replica-$1.engine"; else echo "$ENGINE"; fi; }
is_down() { [ -f "$DIR/down" ] && grep -qx "$1" "$DIR/down"; }
nginx_pid() { cat "$DIR/nginx.pid" 2>/dev/null || true; }

nginx_run() { "$NGINX" -p "$DIR/" -c "$DIR/nginx.conf" -e "$DIR/logs/nginx_error.log" "$@"; }

# --- nginx.conf --------------------------------------------------------------------

render_conf() {
  local out="$DIR/nginx.conf" servers="" locs="" auth user="" pool i p down
  for ((i = 1; i <= REPLICAS; i++)); do
    p=$(replica_port "$i")
    down=""; is_down "$i" && down=" down"
    servers+="        server 127.0.0.1:$p max_fails=$MAX_FAILS fail_timeout=${FAIL_TIMEOUT}s$down;  # replica $i"$'\n'
    locs+="        location = /replica/$i/metrics { allow 127.0.0.1; allow ::1; deny all; proxy_pass http://127.0.0.1:$p/metrics; }"$'\n'
    locs+="        location = /replica/$i/health { proxy_pass http://127.0.0.1:$p/health; }"$'\n'
  done
  servers="${servers%$'\n'}"; locs="${locs%$'\n'}"
  if [ -n "$EDGE_KEY" ]; then
    auth="        default 0;"$'\n'"        \"Bearer $EDGE_KEY\" 1;"
  else
    auth="        default 1;"
  fi
  # As root, nginx's workers would run as nobody, who may not reach $DIR: run them as the
  # owner of the cluster (a system install uses its own user and /var paths instead).
  [ "$(id -u)" = 0 ] && user="user $(id -un) $(id -gn);"
  pool=turbine_least_conn; [ "$AFFINITY" = header ] && pool=turbine_affinity
  # requests without a session: least connections, or nginx's default round robin
  balance="least_conn;"; [ "${BALANCE:-least_conn}" = round_robin ] && balance="# round robin (nginx's default)"
  # nginx may raise its open-file limit up to the hard limit (any user): 8192 at most,
  # half of them connections (a proxied request holds two)
  local nofile; nofile=$(ulimit -Hn)
  { [ "$nofile" = unlimited ] || [ "$nofile" -gt 8192 ]; } && nofile=8192
  [ "$nofile" -ge 64 ] || nofile=64
  local line
  : > "$out.tmp"
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
      @@SERVERS@@) printf '%s\n' "$servers" >> "$out.tmp"; continue ;;
      @@REPLICA_LOCATIONS@@) printf '%s\n' "$locs" >> "$out.tmp"; continue ;;
      @@AUTH_MAP@@) printf '%s\n' "$auth" >> "$out.tmp"; continue ;;
    esac
    line="${line//@@DIR@@/$DIR}"
    line="${line//@@USER@@/$user}"
    line="${line//@@WORKERS@@/$WORKERS}"
    line="${line//@@NOFILE@@/$nofile}"
    line="${line//@@CONNECTIONS@@/$((nofile / 2))}"
    line="${line//@@LISTEN@@/$LISTEN}"
    line="${line//@@SESSION_POOL@@/$pool}"
    line="${line//@@AFFINITY@@/$AFFINITY}"
    line="${line//@@BALANCE@@/$balance}"
    line="${line//@@RATE@@/$RATE}"
    line="${line//@@BURST@@/$BURST}"
    line="${line//@@MAX_BODY@@/$MAX_BODY}"
    line="${line//@@READ_TIMEOUT@@/${READ_TIMEOUT}s}"
    line="${line//@@TRIES@@/$REPLICAS}"
    printf '%s\n' "$line" >> "$out.tmp"
  done < "$TEMPLATE"
  if grep -q '@@[A-Z_]*@@' "$out.tmp"; then die "unfilled placeholder in $out.tmp: $(grep -o '@@[A-Z_]*@@' "$out.tmp" | head -1)"; fi
  # checked before it replaces the running configuration
  if ! "$NGINX" -t -q -p "$DIR/" -c "$out.tmp" -e "$DIR/logs/nginx_error.log" 2>"$DIR/logs/nginx_test.log"; then
    cat "$DIR/logs/nginx_test.log" >&2
    die "nginx refuses the rendered configuration ($out.tmp)"
  fi
  mv "$out.tmp" "$out"
}

# The worker processes of nginx's master (pid $1) whose title is a live worker's.
live_workers() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    if tr '\0' ' ' 2>/dev/null < "/proc/$c/cmdline" | grep -q 'worker process *$'; then echo "$c"; fi
  done
  return 0
}

# nginx -s reload, then wait until the new workers run and the old ones stopped taking
# requests (they finish the ones they hold: a stream in flight goes on).
nginx_reload() {
  local mp old w fresh stale t0
  mp=$(nginx_pid); alive "$mp" || die "nginx is not running (pid file $DIR/nginx.pid)"
  old=" $(live_workers "$mp" | tr '\n' ' ')"
  nginx_run -s reload 2>>"$DIR/logs/nginx_error.log" || die "nginx -s reload failed (logs/nginx_error.log)"
  t0=$SECONDS
  while :; do
    fresh=0; stale=0
    for w in $(live_workers "$mp"); do
      case "$old" in *" $w "*) stale=1 ;; *) fresh=1 ;; esac
    done
    [ "$fresh" = 1 ] && [ "$stale" = 0 ] && break
    [ $((SECONDS - t0)) -lt 20 ] || die "nginx did not apply the new configuration within 20 s (logs/nginx_error.log)"
    sleep 0.05
  done
}

# --- replicas ------------------------------------------------------------------------

wait_health() { # I PID -> 0 once /health is 200; 1 when the process exits or time runs out
  local i=$1 pid=$2 p t0 code
  p=$(replica_port "$i"); t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$START_TIMEOUT" ]; do
    alive "$pid" || { say "replica $i (pid $pid) exited during start; log: $DIR/logs/replica-$i.log"; tail -n 20 "$DIR/logs/replica-$i.log" >&2; return 1; }
    code=$(http_code "$p" /health)
    [ "$code" = 200 ] && return 0
    sleep 0.1
  done
  say "replica $i: no healthy /health within $START_TIMEOUT s"
  return 1
}

launch_replica() { # I ENGINE -> starts it in its own session, writes its pid
  local i=$1 eng=$2 p args=()
  p=$(replica_port "$i")
  if port_open "$p"; then die "port $p (replica $i) is taken"; fi
  [ -n "$eng" ] && [ "$eng" != demo ] && args+=("$eng")
  args+=(--host 127.0.0.1 --port "$p" --threads "$THREADS")
  args+=("${EXTRA[@]+"${EXTRA[@]}"}")
  echo "=== $(date -u +%FT%TZ) start: $TURBINE serve ${args[*]}" >> "$DIR/logs/replica-$i.log"
  # its own session: a terminal's ^C or the end of this script does not stop it
  setsid "$TURBINE" serve "${args[@]}" >> "$DIR/logs/replica-$i.log" 2>&1 < /dev/null &
  echo $! > "$DIR/replica-$i.pid"
  printf '%s\n' "$eng" > "$DIR/replica-$i.engine"
}

# SIGTERM (the server drains: in-flight requests and streams finish, new ones are
# refused), wait for the exit, SIGKILL after $1 seconds. 0 if it exited by itself.
stop_pid() {
  local pid=$1 bound=$2 t0
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  t0=$SECONDS
  while alive "$pid"; do
    if [ $((SECONDS - t0)) -ge "$bound" ]; then
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
      return 1
    fi
    sleep 0.05
  done
  return 0
}

# --- commands --------------------------------------------------------------------------

cmd_start() {
  ENGINE=""; REPLICAS=2; PORT=8000; DIR=./turbine-cluster; THREADS=""; AFFINITY=header; BALANCE=least_conn; LISTEN=""
  EDGE_KEY=""; MAX_BODY=1m; RATE=1000; BURST=2000; MAX_FAILS=3; FAIL_TIMEOUT=10; READ_TIMEOUT=3600
  WORKERS=1; START_TIMEOUT=120; EXTRA=()
  while [ $# -gt 0 ]; do
    case "$1" in --) ;; --*) [ $# -ge 2 ] || die "$1 needs a value" ;; esac
    case "$1" in
      --engine) ENGINE="${2:?--engine needs a file}"; shift 2 ;;
      --replicas) need_uint "$1" "${2:-}"; REPLICAS=$2; shift 2 ;;
      --port) need_uint "$1" "${2:-}"; PORT=$2; shift 2 ;;
      --dir) DIR="${2:?--dir needs a folder}"; shift 2 ;;
      --threads-per-replica) need_uint "$1" "${2:-}"; THREADS=$2; shift 2 ;;
      --affinity) AFFINITY="${2:-}"; shift 2 ;;
      --balance) BALANCE="${2:-}"; shift 2 ;;
      --listen) LISTEN="${2:?--listen needs ADDR:PORT}"; shift 2 ;;
      --edge-api-key) EDGE_KEY="${2:?--edge-api-key needs a key}"; shift 2 ;;
      --max-body) MAX_BODY="${2:-}"; shift 2 ;;
      --rate-limit) need_uint "$1" "${2:-}"; RATE=$2; shift 2 ;;
      --burst) need_uint "$1" "${2:-}"; BURST=$2; shift 2 ;;
      --max-fails) need_uint "$1" "${2:-}"; MAX_FAILS=$2; shift 2 ;;
      --fail-timeout) need_uint "$1" "${2:-}"; FAIL_TIMEOUT=$2; shift 2 ;;
      --read-timeout) need_uint "$1" "${2:-}"; READ_TIMEOUT=$2; shift 2 ;;
      --nginx-workers) need_uint "$1" "${2:-}"; WORKERS=$2; shift 2 ;;
      --start-timeout) need_uint "$1" "${2:-}"; START_TIMEOUT=$2; shift 2 ;;
      --) shift; EXTRA=("$@"); break ;;
      *) die "start: unknown option '$1' (cluster.sh --help)" ;;
    esac
  done
  case "$AFFINITY" in header|none) ;; *) die "--affinity is header or none, not '$AFFINITY'" ;; esac
  case "$BALANCE" in least_conn|round_robin) ;; *) die "--balance is least_conn or round_robin, not '$BALANCE'" ;; esac
  [ "$REPLICAS" -ge 1 ] && [ "$REPLICAS" -le 64 ] || die "--replicas must be 1..64"
  [ "$PORT" -ge 1 ] && [ $((PORT + REPLICAS)) -le 65535 ] || die "--port $PORT leaves no room for $REPLICAS replicas"
  [[ "$MAX_BODY" =~ ^[0-9]+[kKmMgG]?$ ]] || die "--max-body is a size as nginx writes it (512k, 1m), not '$MAX_BODY'"
  [ "$RATE" -ge 1 ] || die "--rate-limit must be at least 1"
  [ "$MAX_FAILS" -ge 1 ] || die "--max-fails must be at least 1"
  if [ -n "$EDGE_KEY" ] && ! [[ "$EDGE_KEY" =~ ^[A-Za-z0-9._+/=-]+$ ]]; then
    die "--edge-api-key: only letters, digits and . _ + / = - (it is written into nginx.conf)"
  fi
  [ -z "$ENGINE" ] || [ "$ENGINE" = demo ] || [ -f "$ENGINE" ] || die "no engine file '$ENGINE'"
  [ -z "$ENGINE" ] || [ "$ENGINE" = demo ] || ENGINE="$(cd "$(dirname "$ENGINE")" && pwd)/$(basename "$ENGINE")"
  TURBINE="$(command -v "$TURBINE")" || die "no turbine binary: set TURBINE_BIN or put turbine on PATH"
  case "$TURBINE" in /*) ;; *) TURBINE="$PWD/$TURBINE" ;; esac
  [ -x "$NGINX" ] || command -v "$NGINX" >/dev/null || die "no nginx: install Debian's nginx (apt-get install nginx) or set NGINX_BIN"
  [ -n "$LISTEN" ] || LISTEN="127.0.0.1:$PORT"
  if [ -z "$THREADS" ]; then
    THREADS=$(( $(nproc) / REPLICAS )); [ "$THREADS" -ge 1 ] || THREADS=1
  fi
  mkdir -p "$DIR"; DIR="$(cd "$DIR" && pwd)"
  local i pid
  if [ -f "$DIR/cluster.env" ]; then
    for i in "$DIR"/replica-*.pid "$DIR/nginx.pid"; do
      [ -f "$i" ] && alive "$(cat "$i")" && die "$DIR already runs a cluster (stop it first: cluster.sh stop --dir $DIR)"
    done
  fi
  rm -f "$DIR"/replica-*.pid "$DIR"/replica-*.engine "$DIR/down" "$DIR/nginx.pid"
  mkdir -p "$DIR/logs" "$DIR/tmp"
  port_open "$(edge_port)" && die "port $(edge_port) (nginx) is taken"
  save_state
  local failed=0
  # whatever ends this start early (an error, ^C) stops what it started
  STARTED=0
  trap '[ "$STARTED" = 1 ] || { say "start failed: stopping what started (logs in $DIR/logs)"; cmd_stop_quiet; }' EXIT
  trap 'exit 1' INT TERM
  # the bundled demo model is built into a cache on first use: one replica builds it, then the rest start
  local first=1
  if [ -z "$ENGINE" ] || [ "$ENGINE" = demo ]; then
    launch_replica 1 "$ENGINE"; wait_health 1 "$(replica_pid 1)" || failed=1; first=2
  fi
  if [ "$failed" = 0 ]; then
    for ((i = first; i <= REPLICAS; i++)); do launch_replica "$i" "$ENGINE"; done
    for ((i = first; i <= REPLICAS; i++)); do wait_health "$i" "$(replica_pid "$i")" || failed=1; done
  fi
  if [ "$failed" = 0 ]; then
    render_conf
    if ! nginx_run < /dev/null > /dev/null 2>>"$DIR/logs/nginx_error.log"; then
      tail -n 5 "$DIR/logs/nginx_error.log" >&2; failed=1
    else
      local t0=$SECONDS
      until [ -n "$(nginx_pid)" ] && [ "$(http_code "$(edge_port)" /health)" = 200 ]; do
        [ $((SECONDS - t0)) -lt 20 ] || { say "nginx did not answer /health within 20 s"; failed=1; break; }
        sleep 0.05
      done
    fi
  fi
  [ "$failed" = 0 ] || exit 1
  STARTED=1
  trap - EXIT INT TERM
  say "started: nginx on $LISTEN (pid $(nginx_pid)), $REPLICAS replicas on 127.0.0.1:$((PORT + 1))..$((PORT + REPLICAS)) with --threads $THREADS, affinity $AFFINITY; folder $DIR"
}

STOP_TIMEOUT=60
cmd_stop_quiet() { cmd_stop_all >/dev/null 2>&1 || true; }

cmd_stop_all() {
  local i pid mp killed=0 workers="" pids=()
  mp=$(nginx_pid)
  if alive "$mp"; then
    workers=$(ps -o pid= --ppid "$mp" 2>/dev/null | tr '\n' ' ' || true)
    kill -QUIT "$mp" 2>/dev/null || true # graceful: finishes the requests it holds
  fi
  for ((i = 1; i <= REPLICAS; i++)); do
    pid=$(replica_pid "$i")
    alive "$pid" && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]+"${pids[@]}"}"; do stop_pid "$pid" "$STOP_TIMEOUT" || { killed=1; say "replica pid $pid did not drain within $STOP_TIMEOUT s: killed"; }; done
  if alive "$mp"; then
    stop_pid "$mp" 10 || killed=1
  fi
  for pid in $workers; do alive "$pid" && kill -KILL "$pid" 2>/dev/null; done
  rm -f "$DIR"/replica-*.pid "$DIR/nginx.pid"
  return $killed
}

cmd_stop() {
  while [ $# -gt 0 ]; do
    case "$1" in --) ;; --*) [ $# -ge 2 ] || die "$1 needs a value" ;; esac
    case "$1" in
      --dir) DIR="${2:-}"; shift 2 ;;
      --timeout) need_uint "$1" "${2:-}"; STOP_TIMEOUT=$2; shift 2 ;;
      *) die "stop: unknown option '$1'" ;;
    esac
  done
  load_state
  if cmd_stop_all; then say "stopped ($DIR)"; else say "stopped ($DIR), some processes only by SIGKILL"; return 1; fi
}

# The options of a command that takes only --dir.
dir_only() {
  local cmd=$1; shift
  while [ $# -gt 0 ]; do
    case "$1" in --) ;; --*) [ $# -ge 2 ] || die "$1 needs a value" ;; esac
    case "$1" in
      --dir) DIR="${2:-}"; shift 2 ;;
      *) die "$cmd: unknown option '$1'" ;;
    esac
  done
}

cmd_status() {
  dir_only status "$@"
  load_state
  local i p pid st code bad=0 mp
  mp=$(nginx_pid)
  if alive "$mp"; then
    code=$(http_code "$(edge_port)" /health)
    echo "nginx     $LISTEN  pid $mp  running  /health $code  affinity $AFFINITY"
  else
    echo "nginx     $LISTEN  not running"; bad=1
  fi
  for ((i = 1; i <= REPLICAS; i++)); do
    p=$(replica_port "$i"); pid=$(replica_pid "$i")
    if alive "$pid"; then st=running; code=$(http_code "$p" /health); else st="not running"; code=-; bad=1; fi
    [ "$code" = 200 ] || [ "$code" = - ] || bad=1
    local mark=""; is_down "$i" && { mark="  (marked down in nginx)"; bad=1; }
    echo "replica $i 127.0.0.1:$p  pid ${pid:--}  $st  /health $code  engine $(replica_engine "$i")$mark"
  done
  return $((bad * 3))
}

# mark --replica I down|up: nginx stops (or starts again) sending it requests.
cmd_mark() {
  local i="" what=""
  while [ $# -gt 0 ]; do
    case "$1" in --) ;; --*) [ $# -ge 2 ] || die "$1 needs a value" ;; esac
    case "$1" in
      --dir) DIR="${2:-}"; shift 2 ;;
      --replica) i="${2:-}"; shift 2 ;;
      down|up) what=$1; shift ;;
      *) die "mark: unknown argument '$1'" ;;
    esac
  done
  load_state
  is_uint "$i" && [ "$i" -ge 1 ] && [ "$i" -le "$REPLICAS" ] || die "mark: --replica 1..$REPLICAS"
  [ -n "$what" ] || die "mark: down or up"
  touch "$DIR/down"
  grep -vx "$i" "$DIR/down" > "$DIR/down.tmp" || true
  [ "$what" = down ] && echo "$i" >> "$DIR/down.tmp"
  mv "$DIR/down.tmp" "$DIR/down"
  render_conf
  # (the time nginx is told: requests it routed to the replica before it go on in
  # its old workers, which the reload waits out; tests/test_cluster.sh reads it)
  echo "=== $(date -u +%FT%TZ) mark: $what at $(date +%s.%N)" >> "$DIR/logs/replica-$i.log"
  nginx_reload
  say "replica $i marked $what"
}

cmd_reload() {
  dir_only reload "$@"
  load_state
  render_conf
  nginx_reload
}

cmd_stop_replica() {
  local i=""
  while [ $# -gt 0 ]; do
    case "$1" in --) ;; --*) [ $# -ge 2 ] || die "$1 needs a value" ;; esac
    case "$1" in
      --dir) DIR="${2:-}"; shift 2 ;;
      --replica) i="${2:-}"; shift 2 ;;
      --timeout) need_uint "$1" "${2:-}"; STOP_TIMEOUT=$2; shift 2 ;;
      *) die "stop-replica: unknown option '$1'" ;;
    esac
  done
  load_state
  is_uint "$i" && [ "$i" -ge 1 ] && [ "$i" -le "$REPLICAS" ] || die "stop-replica: --replica 1..$REPLICAS"
  local pid; pid=$(replica_pid "$i")
  alive "$pid" && echo "=== $(date -u +%FT%TZ) stop: SIGTERM at $(date +%s.%N) to pid $pid" >> "$DIR/logs/replica-$i.log"
  if stop_pid "$pid" "$STOP_TIMEOUT"; then
    rm -f "$DIR/replica-$i.pid"; say "replica $i stopped (drained)"
  else
    rm -f "$DIR/replica-$i.pid"; say "replica $i did not drain within $STOP_TIMEOUT s: killed"; return 1
  fi
}

cmd_start_replica() {
  local i="" eng=""
  while [ $# -gt 0 ]; do
    case "$1" in --) ;; --*) [ $# -ge 2 ] || die "$1 needs a value" ;; esac
    case "$1" in
      --dir) DIR="${2:-}"; shift 2 ;;
      --replica) i="${2:-}"; shift 2 ;;
      --engine) eng="${2:?--engine needs a file}"; shift 2 ;;
      *) die "start-replica: unknown option '$1'" ;;
    esac
  done
  load_state
  is_uint "$i" && [ "$i" -ge 1 ] && [ "$i" -le "$REPLICAS" ] || die "start-replica: --replica 1..$REPLICAS"
  alive "$(replica_pid "$i")" && die "replica $i is running (pid $(replica_pid "$i"))"
  if [ -n "$eng" ] && [ "$eng" != demo ]; then
    [ -f "$eng" ] || die "no engine file '$eng'"
    eng="$(cd "$(dirname "$eng")" && pwd)/$(basename "$eng")"
  fi
  [ -n "$eng" ] || eng=$(replica_engine "$i")
  # the port of a replica that just exited may linger a moment
  local t0=$SECONDS p; p=$(replica_port "$i")
  while port_open "$p" && [ $((SECONDS - t0)) -lt 10 ]; do sleep 0.1; done
  launch_replica "$i" "$eng"
  wait_health "$i" "$(replica_pid "$i")" || { stop_pid "$(replica_pid "$i")" 5 || true; rm -f "$DIR/replica-$i.pid"; return 1; }
  say "replica $i started on 127.0.0.1:$p (pid $(replica_pid "$i"))"
}

[ $# -ge 1 ] || { usage; exit 2; }
cmd=$1; shift
case "$cmd" in
  start) cmd_start "$@" ;;
  stop) cmd_stop "$@" ;;
  status) cmd_status "$@" ;;
  mark) cmd_mark "$@" ;;
  reload) cmd_reload "$@" ;;
  stop-replica) cmd_stop_replica "$@" ;;
  start-replica) cmd_start_replica "$@" ;;
  -h|--help|help) usage ;;
  *) die "unknown command '$cmd' (start, stop, status, mark, reload, stop-replica, start-replica)" ;;
esac
