# Process-level integration tests of chimerad with independent NFS clients.

TEST_TARGETS += test-e2e-local

.PHONY: test-e2e-local
test-e2e-local: build-dataplane build-rpcbench ## chimerad on loopback vs libnfs tools, fio+libnfs (verify), raw hostile RPCs, connection storms
	@scripts/apt-ensure.sh libnfs-utils
	@python3 -m pytest --version >/dev/null 2>&1 || python3 -m pip install -q pytest
	@FIO=$$(e2e/peers/fio-libnfs.sh | tail -1) && \
	  CHIMERAD=$(CHIMERAD) RPCBENCH=$(RPCBENCH) FIO=$$FIO python3 -m pytest -v -p no:cacheprovider e2e/local
