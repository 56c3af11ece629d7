# pNFS flex-files MDS (dataplane/pnfs): its unit tests, and the in-process
# cluster tests (MDS + 3 data servers on 127.0.0.1, a test pNFS client) in
# dataplane/chimerad/tests/pnfs.rs (also part of test-chimerad). Every call
# in them is bounded (10 s RPC/HTTP timeouts, 1 s DS control timeout).

TEST_TARGETS += test-pnfs-unit

.PHONY: test-pnfs-unit
test-pnfs-unit: setup-rust ## pNFS MDS: unit tests + MDS/3-DS in-process tests (cargo test -p pnfs; -p chimerad --test pnfs)
	@mkdir -p $(CACHE)
	cd $(DATAPLANE) && { nice -n 10 $(CARGO) test --release --locked -p pnfs && \
	  nice -n 10 $(CARGO) test --release --locked -p chimerad --test pnfs; } 2>&1 | tee $(CACHE)/last-pnfs-unit-test.log | grep -E '^(test result|running|error|failures|---- )|panicked' ; \
	  test "$$(grep -c '^test result: ok. [1-9]' $(CACHE)/last-pnfs-unit-test.log)" -ge 2 && ! grep -qE '^test result: FAILED|^error' $(CACHE)/last-pnfs-unit-test.log
