#!/bin/busybox sh
# The node's initramfs /init: load virtio and ext4, mount the root disk
# (/dev/vda, built by build-node.sh) and switch_root into its /sbin/node-init.
# runc needs a real root filesystem: pivot_root fails on an initramfs root.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_pci virtio_blk crc32c_generic ext4; do modprobe "$m" || echo "node-initramfs: modprobe $m failed"; done
i=0
# Devices appear asynchronously (no udev): wait up to 10 s for the disk.
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if ! mount -t ext4 /dev/vda /newroot; then
  echo "node-initramfs: cannot mount the root disk /dev/vda"; poweroff -f
fi
mount --move /dev /newroot/dev
umount /proc /sys
exec switch_root /newroot /sbin/node-init
