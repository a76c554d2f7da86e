#!/bin/sh
# Runs inside the freshly debootstrapped node rootfs (chroot) once, at image build.
# Leaves the state a freshly installed Debian server is in, minus what each machine
# must make for itself at first boot (host keys, machine-id, /etc/hosts).
set -eu

# Each node makes its own identity at first boot (node-init).
rm -f /etc/ssh/ssh_host_*
: >/etc/machine-id
rm -f /var/lib/dbus/machine-id

systemctl enable ssh.service
# Units that have nothing to do in a container and would only mark the system degraded.
systemctl mask getty@tty1.service serial-getty@ttyS0.service console-getty.service \
	systemd-udevd.service systemd-udev-trigger.service systemd-modules-load.service \
	sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount \
	systemd-remount-fs.service systemd-firstboot.service 2>/dev/null

# Keys only: the sandbox installs its generated public key at boot.
install -d -m 0700 /root/.ssh
passwd -l root >/dev/null

apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log /tmp/* /var/tmp/*
