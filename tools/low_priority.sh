#!/usr/bin/env bash
# low_priority.sh COMMAND...: run COMMAND on the CPU time that others leave idle. Start it as
# `setsid bash tools/low_priority.sh ...`: its own session, whose process group is then
# COMMAND's whole tree (tools/test_tiers.sh stops it with one kill).
# low_priority.sh --idle-group: exit 0 where COMMAND would run in the idle CPU cgroup (below),
# 1 where only nice is there; runs nothing.
#
# nice alone is not enough where the kernel groups processes: with autogroup (Debian's kernels,
# the CI machine) a nice value counts only inside its session's group, and each session, as
# each container's cgroup, gets an equal share of the CPU. Beside the e2e tier, unit tests at
# `nice -n 10` took half of the CPU from the sandbox's nodes, and the e2e module beside them
# ran twice as long (2026-11-28). So the session's group gets nice 19 too. Even so, the rest of
# the unit tier still took from the e2e tier beside it (2026-11-29): the sandbox's nodes are
# Docker's cgroups, where an autogroup's nice does not reach.
#
# So where the kernel marks a CPU cgroup idle (cpu.idle, Linux 5.15 on; as root), COMMAND runs
# in one, ddpfleet-idle: the scheduler gives it a core only when no task outside the group
# wants one, and any such task that wakes takes the core at once. The e2e modules test_36 and
# test_46 took 790 s with the rest of the unit tier in it beside them, 813 s alone (EPYC
# without AVX512, 2026-12-07); the unit tests passed in the CPU those modules left idle.
set -eu
IDLE_GROUP=
if [ -e /sys/fs/cgroup/cpu/cpu.shares ]; then  # cgroup v1 (cpu may link to cpu,cpuacct)
  IDLE_GROUP=/sys/fs/cgroup/cpu/ddpfleet-idle
elif grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then  # cgroup v2
  IDLE_GROUP=/sys/fs/cgroup/ddpfleet-idle
fi

# idle_group: make the group (once) and mark it idle; fails where the kernel or the user cannot.
idle_group() {
  [ -n "$IDLE_GROUP" ] && mkdir -p "$IDLE_GROUP" 2>/dev/null &&
    echo 1 2>/dev/null >"$IDLE_GROUP/cpu.idle"
}

if [ "${1:-}" = --idle-group ]; then
  idle_group
  exit
fi
if [ "$(ps -o sid= -p $$)" -ne $$ ]; then
  echo "low_priority.sh: start it with setsid (it would renice its caller's session)" >&2
  exit 2
fi
if idle_group; then
  echo $$ 2>/dev/null >"$IDLE_GROUP/cgroup.procs" || true  # else nice alone, as below
fi
if [ -w /proc/self/autogroup ]; then
  echo 19 >/proc/self/autogroup
fi
exec nice -n 19 "$@"
