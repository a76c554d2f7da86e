#!/bin/sh
# Entrypoint of a sandbox node: turn Docker's container files into a server's, then
# hand over to systemd as PID 1.
#
# Docker bind-mounts /etc/hosts and /etc/hostname from outside the container. Ansible
# writes such files by rename, which fails on a mount point ("Device or resource busy"),
# and a real server has plain files there. So unmount them (what is left below is an
# empty file of Docker's init layer, or our own from an earlier boot) and at first
# boot write them the way the Debian installer does -- including
# the "127.0.1.1 <hostname>" line that makes a host resolve its own name to loopback,
# the problem the etc_hosts role must fix. /etc/resolv.conf stays Docker's (its DNS
# forwards to the host's resolver, which the node needs for apt).
set -eu

name=$(hostname)
umount /etc/hosts 2>/dev/null || true
umount /etc/hostname 2>/dev/null || true
if mountpoint -q /etc/hosts; then
	echo "ddpfleet-node-init: cannot unmount Docker's /etc/hosts (is CAP_SYS_ADMIN missing?)" >&2
fi

marker=/var/lib/ddpfleet-sandbox/first-boot-done
if [ ! -e "$marker" ]; then
	echo "$name" >/etc/hostname
	cat >/etc/hosts <<HOSTS
127.0.0.1	localhost
127.0.1.1	$name

# The following lines are desirable for IPv6 capable hosts
::1     localhost ip6-localhost ip6-loopback
ff02::1 ip6-allnodes
ff02::2 ip6-allrouters
HOSTS
	ssh-keygen -A >/dev/null
	install -d -m 0755 /var/lib/ddpfleet-sandbox
	: >"$marker"
fi

exec /sbin/init "$@"
