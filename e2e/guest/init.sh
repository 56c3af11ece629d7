#!/bin/sh
# PID 1 of the test guest (busybox sh). Brings up the minimum a kernel-client
# test needs, runs /test/run.sh (appended by run.sh as a second cpio), and
# reports the outcome with markers on the serial console, because the guest's
# exit status never reaches the host. Then powers off.
export PATH=/usr/sbin:/usr/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run

# GUEST_NONCE (makes the markers unforgeable by test output) and the test's
# variables; written by run.sh.
[ -f /test/env ] && . /test/env
marker="@@CHIMERA-GUEST@@ ${GUEST_NONCE:-none}"
finish() {
  echo "$marker DONE rc=$1"
  sync
  [ -n "$results_mounted" ] && umount /results
  poweroff -f
  sleep 5
}

# No udev: load the drivers for the devices run.sh gives us.
for m in virtio_pci virtio_net 9pnet_virtio 9p; do modprobe "$m" || echo "init: modprobe $m failed"; done
ip link set lo up
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 || echo "init: eth0 setup failed"
# No default route on purpose: the guest talks to the host (10.0.2.2) only.

results_mounted=""
if grep -qx results /sys/bus/virtio/devices/*/mount_tag 2>/dev/null; then
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /results && results_mounted=1
fi
if grep -qx extra /sys/bus/virtio/devices/*/mount_tag 2>/dev/null; then
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,ro extra /opt/extra || echo "init: cannot mount the extra tools share"
fi

[ -f /test/run.sh ] || { echo "init: no /test/run.sh in the initramfs"; finish 127; }
echo "$marker START $(uname -r)"
cd /tmp
# dash, not busybox sh: busybox's shell runs its own applets before PATH, so
# `ip` or `mount` would silently be the reduced busybox versions.
timeout -s KILL "${GUEST_TIMEOUT_S:-600}" dash /test/run.sh
rc=$?
[ -n "$results_mounted" ] && echo "$rc" >/results/rc
finish "$rc"
