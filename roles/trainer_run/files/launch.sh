#!/bin/sh
# ddpfleet launch wrapper (PID 1 of a run's container): runs the command given (torchrun),
# forwards SIGTERM/SIGINT to it, copies its output to <run dir>/nodes/<host>.log and writes
# <run dir>/nodes/<host>.exit = {"host", "node_rank", "exit_code", "time"} when it ends.
# Needs DDPFLEET_RUN_DIR, DDPFLEET_HOST and DDPFLEET_NODE_RANK in the environment.
set -u
nodes="$DDPFLEET_RUN_DIR/nodes"
log="$nodes/$DDPFLEET_HOST.log"
fifo="$(mktemp -u /tmp/ddpfleet-out.XXXXXX)"
mkfifo -m 0600 "$fifo"
tee -a "$log" <"$fifo" &
tee_pid=$!
exec 3>"$fifo"
rm -f "$fifo"
echo "ddpfleet: $(date -u +%Y-%m-%dT%H:%M:%SZ) node_rank $DDPFLEET_NODE_RANK on $DDPFLEET_HOST: $*" >&3
"$@" >&3 2>&3 &
child=$!
signalled=""
trap 'signalled=TERM; echo "ddpfleet: SIGTERM, forwarding to $child" >&3; kill -TERM "$child" 2>/dev/null' TERM
trap 'signalled=INT; echo "ddpfleet: SIGINT, forwarding to $child" >&3; kill -INT "$child" 2>/dev/null' INT
while :; do
  wait "$child"
  rc=$?
  # wait returns early (status > 128) when a trapped signal arrives: wait again until it is gone.
  if kill -0 "$child" 2>/dev/null; then
    continue
  fi
  break
done
if [ -n "$signalled" ] && [ "$rc" -eq 0 ]; then
  rc=143
fi
now="$(date +%s)"
echo "ddpfleet: $(date -u +%Y-%m-%dT%H:%M:%SZ) exit code $rc${signalled:+ after SIG$signalled}" >&3
printf '{"host": "%s", "node_rank": %s, "exit_code": %s, "time": %s}\n' \
  "$DDPFLEET_HOST" "$DDPFLEET_NODE_RANK" "$rc" "$now" >"$nodes/.$DDPFLEET_HOST.exit.tmp"
mv -f "$nodes/.$DDPFLEET_HOST.exit.tmp" "$nodes/$DDPFLEET_HOST.exit"
exec 3>&-
wait "$tee_pid"
exit "$rc"
