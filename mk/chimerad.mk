# chimerad: config, admin API, metrics endpoint, main (dataplane/chimerad).
# Its tests run a real chimerad binary and HTTP over 127.0.0.1; each test is
# bounded by explicit timeouts (start 30 s, stop 20 s, HTTP 10 s).

TEST_TARGETS += test-chimerad

.PHONY: test-chimerad check-chimerad-config
test-chimerad: setup-rust ## chimerad config, admin API and daemon tests
	@mkdir -p $(CACHE)
	cd $(DATAPLANE) && nice -n 10 $(CARGO) test --release --locked -p chimerad 2>&1 | tee $(CACHE)/last-chimerad-test.log | grep -E '^(test result|running|error|failures|---- )' ; \
	  grep -q '^test result: ok. [1-9]' $(CACHE)/last-chimerad-test.log && ! grep -qE '^test result: FAILED|^error' $(CACHE)/last-chimerad-test.log

check-chimerad-config: build-dataplane ## validate a config file: make check-chimerad-config CONFIG=path.json
	@test -n "$(CONFIG)" || { echo "usage: make check-chimerad-config CONFIG=path.json"; exit 2; }
	$(CHIMERAD) --check-config --config $(CONFIG)
