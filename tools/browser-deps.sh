#!/usr/bin/env bash
# Make sure the tests' browser is there: Debian's headless Chromium (and a font), which
# renders the monitoring console page (a unit test, and the e2e tier). Returns at once where
# it is; installs it with apt where we are root on a Debian-like host (CI, a bare build
# machine); anywhere else prints one line saying what is missing and exits 1.
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
	echo "browser-deps: installing chromium (apt)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		chromium fonts-dejavu-core >/dev/null
	exit 0
fi
echo "browser-deps: the console page tests (unit and e2e) need chromium (Debian/Ubuntu: apt-get install chromium)" >&2
exit 1
