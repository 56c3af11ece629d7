# pNFS multi-host test (e2e/pnfs): the MDS and three data servers, each
# chimerad in its own network namespace and address on a private bridge, and
# the Linux kernel client in the QEMU guest inside a client namespace.
# Results under $(CACHE)/pnfs/results/<run>/<case>/.

PNFS_E2E := e2e/pnfs
# What `make test` runs: the harness without layouts (the contrast), striping
# over 3 DSes, one DS killed with a single copy (I/O errors allowed, wrong
# data never), a DS added and another drained at run time. ~6-7 min warm.
PNFS_CASES ?= topology stripe dsfail1 member
# Not in make test yet: with mirrors=2 the files read back as zeros (most
# stripe units) although both copies were written to the DSes — a server bug
# this suite found (see e2e/pnfs/README.md); `make test-pnfs-mirrors` shows it.
PNFS_MIRROR_CASES := mirror2 dsfail

TEST_TARGETS += test-pnfs

.PHONY: setup-pnfs test-pnfs test-pnfs-topology test-pnfs-mirrors
setup-pnfs:
	@scripts/apt-ensure.sh iproute2 iputils-ping curl util-linux

test-pnfs: setup-pnfs guest-image build-dataplane ## pNFS with the kernel client, MDS + 3 DSes in namespaces (PNFS_CASES to pick)
	$(PNFS_E2E)/test-pnfs.sh $(CHIMERAD) $(PNFS_CASES)

test-pnfs-topology: setup-pnfs guest-image build-dataplane ## pNFS harness only: 5 namespaces, guest mounts the MDS at its own address (no layouts)
	$(PNFS_E2E)/test-pnfs.sh $(CHIMERAD) topology

test-pnfs-mirrors: setup-pnfs guest-image build-dataplane ## pNFS mirrors=2, and mirrors=2 with a DS killed (failing: see mk/pnfs.mk)
	$(PNFS_E2E)/test-pnfs.sh $(CHIMERAD) $(PNFS_MIRROR_CASES)
