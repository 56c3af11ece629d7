# NFSv4.1 server operations (dataplane/nfs4): unit and COMPOUND-level tests.

TEST_TARGETS += test-nfs4

.PHONY: test-nfs4
test-nfs4: setup-rust ## NFSv4.1 state machine and COMPOUND tests (cargo test -p nfs4)
	@mkdir -p $(CACHE)
	cd $(DATAPLANE) && nice -n 10 $(CARGO) test --release --locked -p nfs4 2>&1 | tee $(CACHE)/last-nfs4-test.log | grep -E '^(test result|running|error|failures|---- )|panicked' ; \
	  grep -q '^test result: ok. [1-9]' $(CACHE)/last-nfs4-test.log && ! grep -qE '^test result: FAILED|^error' $(CACHE)/last-nfs4-test.log
