#!/usr/bin/env bash
# low_priority.sh COMMAND...: run COMMAND on the CPU time that others leave idle. Start it as
# `setsid bash tools/low_priority.sh ...`: its own session, whose process group is then
# COMMAND's whole tree (tools/test_tiers.sh stops it with one kill).
#
# nice alone is not enough where the kernel groups processes: with autogroup (Debian's kernels,
# the CI machine) a nice value counts only inside its session's group, and each session, as
# each container's cgroup, gets an equal share of the CPU. Beside the e2e tier, unit tests at
# `nice -n 10` took half of the CPU from the sandbox's nodes, and the e2e module beside them
# ran twice as long (2026-11-28). So the session's group gets nice 19 too.
set -eu
if [ "$(ps -o sid= -p $$)" -ne $$ ]; then
  echo "low_priority.sh: start it with setsid (it would renice its caller's session)" >&2
  exit 2
fi
if [ -w /proc/self/autogroup ]; then
  echo 19 >/proc/self/autogroup
fi
exec nice -n 19 "$@"
