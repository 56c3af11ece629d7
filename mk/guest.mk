# QEMU guest with the Linux kernel NFS client, and the kernel-client suite
# (e2e/guest). The guest image is cached under $(CACHE)/guest/.

GUEST := e2e/guest

SETUP_TARGETS += guest-image
TEST_TARGETS += test-guest test-guest-restart

.PHONY: guest-image test-guest test-guest-restart test-guest-ganesha test-guest-smoke
guest-image: ## build (or reuse) the QEMU guest: Debian kernel + NFS/RDMA tools initramfs
	$(GUEST)/build-image.sh

test-guest-smoke: guest-image ## boot the guest once: tools, modules, soft-RoCE and the results share work
	$(GUEST)/run.sh -o $(CACHE)/guest/results/smoke $(GUEST)/tests/smoke.sh

test-guest: guest-image build-dataplane ## kernel NFS client (v3, v4.1, and no vers= which negotiates 4.2) in the guest against chimerad on memfs and on diskfs
	$(GUEST)/test-nfs.sh chimerad $(CHIMERAD)
	BACKEND=diskfs $(GUEST)/test-nfs.sh chimerad $(CHIMERAD)

test-guest-ganesha: guest-image ## the same suite against NFS-Ganesha (validates the harness)
	$(GUEST)/test-nfs.sh ganesha

test-guest-restart: guest-image build-dataplane ## kernel client (v3, v4.1) keeps writing across a kill -9 and restart of chimerad on diskfs
	$(GUEST)/test-restart.sh $(CHIMERAD)
