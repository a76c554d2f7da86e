#!/usr/bin/env bash
# `make test`: every tier, each tier's time printed. lint first (seconds, and it stops a
# broken tree early); then the unit tier runs beside the e2e tier, because the e2e tier's
# first quarter (building the node images, the first site.yml) waits on downloads, dpkg and
# SSH round trips far more than on the CPU, and the unit tier fills those two cores. The unit
# tier's output goes to a file and is printed when it ends, so neither tier's lines interleave.
# Both tiers always run to their end; the exit status is non-zero when either failed.
set -uo pipefail
cd "$(dirname "$0")/.."
MAKE=${MAKE:-make}
UNIT_LOG=${UNIT_LOG:-.cache/unit-tier.log}

now() { date +%s; }

start=$(now)
if ! $MAKE --no-print-directory lint; then
  echo "make test: tier lint failed after $(( $(now) - start )) s"
  exit 1
fi
echo "make test: tier lint took $(( $(now) - start )) s"

mkdir -p "$(dirname "$UNIT_LOG")"
unit_start=$(now)
( $MAKE --no-print-directory unit >"$UNIT_LOG" 2>&1; echo $? >"$UNIT_LOG.rc"; date +%s >"$UNIT_LOG.end" ) &
unit_pid=$!
echo "make test: tier unit runs beside tier e2e; its output follows when it ends ($UNIT_LOG)"

e2e_start=$(now)
$MAKE --no-print-directory e2e
e2e_rc=$?
e2e_end=$(now)

wait "$unit_pid"
echo "---------------------------------- tier unit ----------------------------------"
cat "$UNIT_LOG"
unit_rc=$(cat "$UNIT_LOG.rc")
unit_took=$(( $(cat "$UNIT_LOG.end") - unit_start ))

status=0
for tier in unit e2e; do
  if [ "$tier" = unit ]; then rc=$unit_rc took=$unit_took; else rc=$e2e_rc took=$(( e2e_end - e2e_start )); fi
  if [ "$rc" = 0 ]; then
    echo "make test: tier $tier took $took s"
  else
    echo "make test: tier $tier failed after $took s"
    status=1
  fi
done
echo "make test: every tier took $(( $(now) - start )) s"
exit "$status"
