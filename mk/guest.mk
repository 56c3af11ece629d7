# QEMU guest with the Linux kernel NFS client, and the kernel-client suite
# (e2e/guest). The guest image is cached under $(CACHE)/guest/.

GUEST := e2e/guest

SETUP_TARGETS += guest-image
TEST_TARGETS += test-guest test-guest-restart test-guest-vfio test-guest-rdma

.PHONY: guest-image test-guest test-guest-restart test-guest-vfio test-guest-rdma build-rdma build-nvme test-guest-ganesha test-guest-smoke
guest-image: ## build (or reuse) the QEMU guest: Debian kernel + NFS/RDMA tools initramfs
	$(GUEST)/build-image.sh

test-guest-smoke: guest-image ## boot the guest once: tools, modules, soft-RoCE and the results share work
	$(GUEST)/run.sh -o $(CACHE)/guest/results/smoke $(GUEST)/tests/smoke.sh

test-guest: guest-image build-dataplane ## kernel NFS client (v3, v4.1, and no vers= which negotiates 4.2; one guest boot per backend) in the guest against chimerad on memfs and on diskfs
	$(GUEST)/test-nfs.sh chimerad $(CHIMERAD)
	BACKEND=diskfs $(GUEST)/test-nfs.sh chimerad $(CHIMERAD)

test-guest-ganesha: guest-image ## the same suite against NFS-Ganesha (validates the harness)
	$(GUEST)/test-nfs.sh ganesha

test-guest-restart: guest-image build-dataplane ## kernel client (v3, v4.1) keeps writing across a kill -9 and restart of chimerad on diskfs
	$(GUEST)/test-restart.sh $(CHIMERAD)

NVME_CHECK := $(CARGO_TARGET_DIR)/release/chimera-nvme-check
FSCK := $(CARGO_TARGET_DIR)/release/chimera-fsck

CRASH_TEST := $(CARGO_TARGET_DIR)/release/diskfs-crash-test

build-nvme: setup-rust ## build the userspace NVMe driver's check tool, chimera-fsck (vfio: devices) and the diskfs crash-state test binary (for the guest)
	cd $(DATAPLANE) && nice -n 10 $(CARGO) build --release --locked -p nvme -p diskfs
	cd $(DATAPLANE) && nice -n 10 $(CARGO) test --release --locked -p diskfs --test crash --no-run --message-format=json \
	  | python3 -c 'import json,sys; exe=[m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "crash"]; assert exe, "no crash test executable"; print(exe[-1])' \
	  | xargs -I{} cp {} $(CRASH_TEST)

test-guest-vfio: guest-image build-dataplane build-nvme ## the userspace NVMe driver on emulated NVMe behind an emulated IOMMU: refusals, identify, 10,000 verified I/Os, diskfs + kernel client (v3, v4.1), kill -9 restart, fsck over vfio and io_uring, QD1/QD32 figures
	$(GUEST)/test-vfio.sh $(CHIMERAD) $(NVME_CHECK) $(FSCK) $(CRASH_TEST)

RDMA_PROBE := $(CARGO_TARGET_DIR)/release/chimera-rdma-probe

build-rdma: setup-rust ## build chimera-rdma-probe (the raw RPC-over-RDMA client of the guest's hostile-input suite)
	cd $(DATAPLANE) && nice -n 10 $(CARGO) build --release --locked -p rdma --bin chimera-rdma-probe

test-guest-rdma: guest-image build-dataplane build-rdma build-fio-engine build-fuse ## NFS over RDMA: chimerad on soft RoCE (rxe) in the guest; the kernel client mounts proto=rdma at v3 and v4.1 and passes the whole file workload; mountstats and chimerad's RDMA Read/Write counters agree; our fio engine over RDMA (NFSv3 and pNFS) verifies; chimera-fuse over RDMA; RDMA vs TCP 4 KiB QD1 figures, engine and kernel
	$(GUEST)/test-rdma.sh $(CHIMERAD) $(RDMA_PROBE) $(FIO_ENGINE) "$$(e2e/peers/fio-libnfs.sh)" $(CHIMERA_FUSE)
