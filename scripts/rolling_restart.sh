#!/usr/bin/env bash
# rolling_restart.sh — restarts the replicas of a cluster.sh cluster one at a time
# without failing a request or cutting a stream:
#
#   rolling_restart.sh --dir D [--engine NEW] [--timeout S]
#
# For each replica: mark it down in nginx.conf and reload nginx (new requests go to the
# others; nginx's old workers finish the requests they hold), SIGTERM it (the server
# drains: its in-flight requests and streams finish, new connections are refused),
# wait for its exit (SIGKILL after --timeout, default 60 s: reported, exit 1), start it
# again on the same port (with NEW when given), wait for /health, mark it up, reload.
# A replica that does not come back stops the procedure with the others still serving
# and that one marked down (exit 1). docs/DEPLOY.md, "Rolling restart".
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CLUSTER="$HERE/cluster.sh"
DIR="" ENGINE_NEW="" TIMEOUT=60

die() { echo "rolling_restart.sh: $*" >&2; exit 2; }
say() { echo "rolling_restart.sh: $(date -u +%T) $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in -h|--help) ;; --*) [ $# -ge 2 ] || die "$1 needs a value" ;; esac
  case "$1" in
    --dir) DIR="${2:-}"; shift 2 ;;
    --engine) ENGINE_NEW="${2:?--engine needs a file}"; shift 2 ;;
    --timeout) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "--timeout needs seconds"; TIMEOUT=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1'" ;;
  esac
done
[ -n "$DIR" ] || die "--dir D is required"
[ -f "$DIR/cluster.env" ] || die "$DIR holds no cluster (no cluster.env)"
if [ -n "$ENGINE_NEW" ] && [ "$ENGINE_NEW" != demo ]; then
  [ -f "$ENGINE_NEW" ] || die "no engine file '$ENGINE_NEW'"
fi
REPLICAS=$(. "$DIR/cluster.env" && echo "$REPLICAS")
[ "$REPLICAS" -ge 2 ] || say "warning: one replica: requests fail while it restarts"

"$CLUSTER" status --dir "$DIR" > /dev/null || die "the cluster is not healthy before the restart (cluster.sh status --dir $DIR)"

rc=0
for ((i = 1; i <= REPLICAS; i++)); do
  say "replica $i: marking down"
  "$CLUSTER" mark --dir "$DIR" --replica "$i" down
  say "replica $i: SIGTERM, draining"
  if ! "$CLUSTER" stop-replica --dir "$DIR" --replica "$i" --timeout "$TIMEOUT"; then
    say "replica $i did not drain within $TIMEOUT s and was killed (its streams were cut)"
    rc=1
  fi
  say "replica $i: starting${ENGINE_NEW:+ with $ENGINE_NEW}"
  if ! "$CLUSTER" start-replica --dir "$DIR" --replica "$i" ${ENGINE_NEW:+--engine "$ENGINE_NEW"}; then
    say "replica $i did not start: it stays marked down, the others serve; see $DIR/logs/replica-$i.log"
    exit 1
  fi
  say "replica $i: marking up"
  "$CLUSTER" mark --dir "$DIR" --replica "$i" up
done
if [ -n "$ENGINE_NEW" ]; then
  # the cluster's engine from now on (a later restart or start-replica uses it)
  new="$ENGINE_NEW"; [ "$new" = demo ] || new="$(cd "$(dirname "$new")" && pwd)/$(basename "$new")"
  sed -i "s|^ENGINE=.*|ENGINE=$(printf '%q' "$new" | sed 's/[|&\\]/\\&/g')|" "$DIR/cluster.env"
fi
say "done: $REPLICAS replicas restarted"
exit $rc
