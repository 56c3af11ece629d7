# The fio engine over the userspace NFS client (dataplane/fio/README.md).
#
#   make build-fio-engine   the .so fio loads with --ioengine=external:<path>
#   make test-fio-engine    real fio against chimerad: verify, interop with libnfs, hostile options (< 1 min)
#   make test-nfs-module-ganesha  the nfs module over NFS-Ganesha: the engine across a chimerad restart, handle_map (< 1 min)

FIO_ENGINE := $(CARGO_TARGET_DIR)/release/chimera-fio.so

BUILD_TARGETS += build-fio-engine
TEST_TARGETS += test-fio-engine test-nfs-module-ganesha

.PHONY: build-fio-engine test-fio-engine test-nfs-module-ganesha
build-fio-engine: setup-rust ## the fio engine over the userspace client (needs the fio source e2e/peers builds)
	@e2e/peers/fio-libnfs.sh >/dev/null
	cd $(DATAPLANE) && nice -n 10 $(CARGO) build --release --locked -p fio-engine
	$(DATAPLANE)/fio/build-engine.sh $(CARGO_TARGET_DIR)/release/libchimera_fio.a $(FIO_ENGINE)

test-fio-engine: build-dataplane build-fio-engine ## fio with our engine against chimerad: crc32c verify at depth, fsync, libnfs reads back what it wrote, a failing control, hostile options
	$(DATAPLANE)/fio/test-engine.sh "$$(e2e/peers/fio-libnfs.sh)" $(FIO_ENGINE) $(CHIMERAD)

test-nfs-module-ganesha: setup-bench build-dataplane build-fio-engine ## the nfs module with NFS-Ganesha as the remote: fio (our engine) across a kill -9 of chimerad, handles kept by handle_map; a control without it fails
	$(DATAPLANE)/nfsvfs/test-ganesha.sh "$$(e2e/peers/fio-libnfs.sh)" $(FIO_ENGINE) $(CHIMERAD)
