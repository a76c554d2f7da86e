#!/usr/bin/env bash
# Make sure this host can run the sandbox: a Docker engine that answers, debootstrap
# (to build node images without pulling anything), an SSH client and iproute2 (the
# address-range check reads `ip -json address/route`).
#
# Where everything is present this returns in well under a second. Where the engine is
# missing and we are root on a Debian-like host whose PID 1 is not systemd (a CI
# container, this build machine), it installs the packages with apt and starts dockerd
# in the background (log: /var/log/dockerd.log). Anywhere else it prints one line
# saying what is missing and exits 1: installing a Docker engine on a workstation is
# the user's decision, not ours.
set -euo pipefail

readonly SOCKET=/var/run/docker.sock
readonly DOCKERD_LOG=/var/log/dockerd.log
readonly PIDFILE=/var/run/docker.pid
readonly WAIT_SECONDS=60

die() {
	echo "sandbox host-deps: $*" >&2
	exit 1
}

engine_answers() {
	command -v docker >/dev/null 2>&1 && docker info --format '{{.ServerVersion}}' >/dev/null 2>&1
}

missing_tools() {
	local tool missing=()
	for tool in debootstrap ssh ssh-keygen ip; do
		command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
	done
	echo "${missing[@]:-}"
}

can_self_install() {
	[[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1 &&
		[[ $(cat /proc/1/comm 2>/dev/null) != systemd ]]
}

apt_install() {
	echo "sandbox host-deps: installing $* with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	# The package lists may be stale or absent in a fresh container: update once.
	apt-get update -qq >/dev/null || die "apt-get update failed; cannot install $*"
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
		die "apt-get install $* failed"
}

# The host's own dockerd, by its pid file: `pgrep dockerd` would also match the nested
# engines inside sandbox nodes, which the host's process table shows too.
host_dockerd_running() {
	[[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

start_dockerd() {
	if [[ -S $SOCKET ]] && ! host_dockerd_running; then
		rm -f "$SOCKET" # stale socket from an engine that died
	fi
	if ! host_dockerd_running; then
		echo "sandbox host-deps: starting dockerd (log: $DOCKERD_LOG)" >&2
		nohup dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
		disown
	fi
	local waited=0
	until engine_answers; do
		((waited < WAIT_SECONDS)) ||
			die "dockerd did not answer within ${WAIT_SECONDS}s; see $DOCKERD_LOG: $(tail -n 1 "$DOCKERD_LOG" 2>/dev/null)"
		sleep 1
		waited=$((waited + 1))
	done
}

main() {
	local packages=() missing
	missing=$(missing_tools)
	[[ -n $missing ]] && packages+=(debootstrap openssh-client iproute2)
	if ! engine_answers && ! command -v dockerd >/dev/null 2>&1; then
		packages+=(docker.io)
	fi

	if ((${#packages[@]} > 0)); then
		can_self_install ||
			die "missing on this host: ${packages[*]}: install a Docker engine, debootstrap and an SSH client (as root on Debian/Ubuntu: apt-get install docker.io debootstrap openssh-client)"
		# iptables is what dockerd needs for its bridge networks; docker.io pulls it in.
		apt_install "${packages[@]}"
	fi

	if ! engine_answers; then
		can_self_install ||
			die "no Docker engine answers at $SOCKET: start it (e.g. 'systemctl start docker') and check 'docker info'"
		start_dockerd
	fi
}

main "$@"
