# pNFS multi-host test (e2e/pnfs): the MDS and three data servers, each
# chimerad in its own network namespace and address on a private bridge, and
# the Linux kernel client in the QEMU guest inside a client namespace (or, in
# the engine case, our fio engine run from that namespace, no guest).
# Results under $(CACHE)/pnfs/results/<run>/<case>/.

PNFS_E2E := e2e/pnfs
# What `make test` runs: the harness without layouts (the contrast), striping
# over 3 DSes, mirrors=2, mirrors=2 with a DS killed, one copy with a DS
# killed (I/O errors allowed, wrong data never), a DS added and another
# drained at run time. One guest boot each, ~8-10 min warm on a loaded box.
# Then our fio engine in pNFS mode against mirrors=2, with a DS killed under
# it (no guest, ~10 s).
PNFS_CASES ?= topology stripe mirror2 dsfail dsfail1 member engine

# The same under NFSv4.2 (layouts, recalls as 4.2 callbacks, LAYOUTSTATS /
# LAYOUTERROR as 4.2 operations): a slice in `make test`, every case with
# `make test-pnfs PNFS_NFS_VERS=4.2`.
PNFS_42_CASES ?= stripe mirror2

TEST_TARGETS += test-pnfs test-pnfs-42

.PHONY: setup-pnfs test-pnfs test-pnfs-42 test-pnfs-topology test-pnfs-engine
setup-pnfs:
	@scripts/apt-ensure.sh iproute2 iptables iputils-ping curl util-linux

test-pnfs: setup-pnfs guest-image build-dataplane build-fio-engine ## pNFS with the kernel client and our fio engine, MDS + 3 DSes in namespaces (PNFS_CASES to pick)
	FIO_ENGINE=$(FIO_ENGINE) FIO="$$(e2e/peers/fio-libnfs.sh)" $(PNFS_E2E)/test-pnfs.sh $(CHIMERAD) $(PNFS_CASES)

test-pnfs-42: setup-pnfs guest-image build-dataplane ## pNFS with the kernel client mounting NFSv4.2: striping and mirrors=2 (PNFS_42_CASES)
	PNFS_NFS_VERS=4.2 $(PNFS_E2E)/test-pnfs.sh $(CHIMERAD) $(PNFS_42_CASES)

test-pnfs-topology: setup-pnfs guest-image build-dataplane ## pNFS harness only: 5 namespaces, guest mounts the MDS at its own address (no layouts)
	$(PNFS_E2E)/test-pnfs.sh $(CHIMERAD) topology

test-pnfs-engine: setup-pnfs build-dataplane build-fio-engine ## our fio engine in pNFS mode (no guest): verify at depth, bytes on the DSes x2, a DS killed under fio
	FIO_ENGINE=$(FIO_ENGINE) FIO="$$(e2e/peers/fio-libnfs.sh)" $(PNFS_E2E)/test-pnfs.sh $(CHIMERAD) engine
