# pNFS multi-host test (e2e/pnfs): the MDS and three data servers, each
# chimerad in its own network namespace and address on a private bridge, and
# the Linux kernel client in the QEMU guest inside a client namespace.
# Results under $(CACHE)/pnfs/results/<run>/<case>/.

PNFS_E2E := e2e/pnfs

TEST_TARGETS += test-pnfs-topology

.PHONY: setup-pnfs test-pnfs test-pnfs-topology
setup-pnfs:
	@scripts/apt-ensure.sh iproute2 iputils-ping curl util-linux

test-pnfs-topology: setup-pnfs guest-image build-dataplane ## pNFS harness: 5 namespaces, guest mounts the MDS at its own address (no layouts)
	$(PNFS_E2E)/test-pnfs.sh $(CHIMERAD) topology

test-pnfs: setup-pnfs guest-image build-dataplane ## pNFS with the kernel client: striping, mirrors=2, a DS killed (PNFS_CASES to pick)
	$(PNFS_E2E)/test-pnfs.sh $(CHIMERAD) $(PNFS_CASES)
