#!/usr/bin/env bash
# `make test`: every tier (lint, unit, e2e), each part's time printed, so a red or slow CI
# shows where the time went.
#
# The unit tier runs in two parts. Its tests that assert bounds in wall-clock seconds (marker
# `wallclock`: the run agent's and the doctor's tests, a few trainer ones) run first, with lint
# beside them at the lowest priority; then the e2e tier, with the rest of the unit tier beside
# it on the CPU the e2e tier leaves idle (tools/low_priority.sh: an idle CPU cgroup). The e2e
# tier waits on its runs' timeouts, heartbeats and CPU quotas: 35 % of two cores were idle in
# test_36, 52 % in test_46 (EPYC without AVX512, 2026-12-07), and the rest of the unit tier,
# 2,249 tests and 6-7 min alone, passed in that idle time while the two modules took 790 s
# with it beside them and 813 s alone. Where no idle cgroup can be made (not root, no
# cpu.idle), the rest of the unit tier runs alone before the e2e tier: beside it at nice 19
# only, it made the e2e modules take 1.4-1.7 times their time alone (2-core Xeon, 2026-11-29).
#
# Wall-clock bounds (tests/time_bounds.py) are twice as wide here as the strict figures that
# `make unit` and `make e2e` check alone: CI's 2-core hosts ran the same tests 1.8-3.5 times
# slower on some days than on others (2026-11-29). DDPFLEET_TEST_TIME_FACTOR overrides it.
set -uo pipefail
cd "$(dirname "$0")/.."
export DDPFLEET_TEST_TIME_FACTOR=${DDPFLEET_TEST_TIME_FACTOR:-2}
make_=(${MAKE:-make} --no-print-directory)

# run NAME COMMAND...: run COMMAND, then say how long part NAME took and whether it failed.
run() {
  local name=$1 start rc=0
  shift
  start=$(date +%s)
  "$@" || rc=$?
  echo "make test: $name took $(($(date +%s) - start)) s$([ "$rc" = 0 ] || echo ", FAILED (exit $rc)")"
  return "$rc"
}

scratch=$(mktemp -d)
sessions=()  # the low-priority sessions started below, each stopped with one kill on exit
trap 'for s in "${sessions[@]}"; do kill -- -"$s" 2>/dev/null; done; rm -rf "$scratch"' EXIT

# beside LOG NAME COMMAND...: start part NAME in a session of its own at the lowest priority,
# its output to LOG; its pid is then ${sessions[-1]}.
export -f run  # for the bash of each such session
beside() {
  local log=$1
  shift
  setsid bash tools/low_priority.sh bash -c 'run "$@"' run "$@" >"$log" 2>&1 &
  sessions+=("$!")
}

# Lint beside the wall-clock tests, at the lowest priority: those tests leave ~40 % of two
# cores idle (287 s user + 36 s sys in 268 s; Xeon, 2026-11-29), and with lint beside they
# took 253 s instead of 261, lint's 40 s gone from the critical path.
beside "$scratch/lint.log" "tier lint (beside the wall-clock tests)" "${make_[@]}" lint
unit_rc=0
run "tier unit, its wall-clock tests" "${make_[@]}" unit UNIT_ARGS="-m wallclock" || unit_rc=$?
lint_rc=0
wait "${sessions[-1]}" || lint_rc=$?
cat "$scratch/lint.log"
[ "$lint_rc" = 0 ] && [ "$unit_rc" = 0 ] || exit 1
# The rest by module (`--dist loadscope`): a module's 2-rank run behind a module fixture is then
# made once, not once on each worker that xdist's default spreads its tests to (in two runs so,
# 2 of those fixtures were made twice, 10-31 s each time): 418, 428 and 448 s (the last in a
# fresh-clone rehearsal of .ci/run) instead of 450 and 461 (EPYC without AVX512, 2026-12-07).
# (`--dist loadgroup` with marks would group fewer tests, but pytest 9 ignores the group xdist
# 3.8 appends to a test's id: the tests were spread as before.)
rest=("${make_[@]}" unit UNIT_ARGS="-m 'not wallclock' --dist loadscope")
e2e_rc=0
if bash tools/low_priority.sh --idle-group; then
  # No test of this part bounds wall time (those are the `wallclock` part's): its within()
  # seconds are only hang guards, three times as wide again on the CPU the e2e tier leaves it.
  # In the first site.yml's pulls that was none for minutes: a 2-rank run of 29 s alone took
  # 172 s, against a guard of 480 s (EPYC without AVX512, 2026-12-07).
  DDPFLEET_TEST_TIME_FACTOR=$(awk -v f="$DDPFLEET_TEST_TIME_FACTOR" 'BEGIN { print f * 3 }') \
    beside "$scratch/unit.log" "tier unit, the rest (beside the e2e tier, on its idle CPU)" \
    "${rest[@]}"
  run "tier e2e" "${make_[@]}" e2e || e2e_rc=$?
  wait "${sessions[-1]}" || unit_rc=$?
  cat "$scratch/unit.log"
else
  run "tier unit, the rest" "${rest[@]}" || unit_rc=$?
  run "tier e2e" "${make_[@]}" e2e || e2e_rc=$?
fi
[ "$unit_rc" = 0 ] && [ "$e2e_rc" = 0 ]
