#!/usr/bin/env bash
# `make test`: every tier (lint, unit, e2e), each part's time printed, so a red or slow CI
# shows where the time went.
#
# The unit tier runs in two parts. Its tests that assert bounds in wall-clock seconds (marker
# `wallclock`: the run agent's and the doctor's tests, a few trainer ones) run first, with lint
# beside them at the lowest priority; then the rest of the tier, then the e2e tier, each alone.
# The rest of the unit tier used to run beside the e2e tier at nice 19, but it still took from
# it: in a fresh-clone rehearsal the e2e modules it ran beside took 1.4-1.7 times their time
# alone on the same host an hour earlier (e2e 52.4 min with it beside, 40.5 alone), while the
# rest of the unit tier alone takes 7.0 min (2-core Xeon, 2026-11-29).
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
lint=0  # lint's session once started (below); 0: none yet, and `kill -- -0` would be ours
trap '[ "$lint" = 0 ] || kill -- -$lint 2>/dev/null; kill $(jobs -p) 2>/dev/null; rm -rf "$scratch"' EXIT

# Lint beside the wall-clock tests, at the lowest priority: those tests leave ~40 % of two
# cores idle (287 s user + 36 s sys in 268 s; Xeon, 2026-11-29), and with lint beside they
# took 253 s instead of 261, lint's 40 s gone from the critical path.
export -f run  # for the bash of lint's own session
setsid bash tools/low_priority.sh bash -c 'run "$@"' lint "tier lint (beside the wall-clock tests)" \
  "${make_[@]}" lint >"$scratch/lint.log" 2>&1 &
lint=$!
unit_rc=0
run "tier unit, its wall-clock tests" "${make_[@]}" unit UNIT_ARGS="-m wallclock" || unit_rc=$?
lint_rc=0
wait "$lint" || lint_rc=$?
cat "$scratch/lint.log"
[ "$lint_rc" = 0 ] && [ "$unit_rc" = 0 ] || exit 1
# The rest by module (`--dist loadscope`): a module's 2-rank run behind a module fixture is then
# made once, not once on each worker that xdist's default spreads its tests to (in two runs so,
# 2 of those fixtures were made twice, 10-31 s each time): 418, 428 and 448 s (the last in a
# fresh-clone rehearsal of .ci/run) instead of 450 and 461 (EPYC without AVX512, 2026-12-07).
# (`--dist loadgroup` with marks would group fewer tests, but pytest 9 ignores the group xdist
# 3.8 appends to a test's id: the tests were spread as before.)
run "tier unit, the rest" "${make_[@]}" unit UNIT_ARGS="-m 'not wallclock' --dist loadscope" \
  || unit_rc=$?
e2e_rc=0
run "tier e2e" "${make_[@]}" e2e || e2e_rc=$?
[ "$unit_rc" = 0 ] && [ "$e2e_rc" = 0 ]
