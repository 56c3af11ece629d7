# Monitoring: the chart's alert rules, Grafana dashboard and ServiceMonitor
# (charts/chimera/files/, templates/monitoring-*.yaml) against promtool, helm
# and a running chimerad (e2e/monitoring). promtool comes from Debian's
# prometheus package; the tests start no Prometheus server.

SETUP_TARGETS += setup-monitoring
TEST_TARGETS += test-monitoring

.PHONY: setup-monitoring test-monitoring
setup-monitoring: ## promtool (Debian package prometheus), PyYAML, pytest, helm
	@scripts/apt-ensure.sh prometheus
	@python3 -c "import yaml" 2>/dev/null || python3 -m pip install -q pyyaml
	@python3 -m pytest --version >/dev/null 2>&1 || python3 -m pip install -q pytest
	@hack/tools.sh helm

test-monitoring: setup-monitoring build-dataplane ## promtool check/test rules, dashboard queries parse, ServiceMonitor/PrometheusRule renders, rule+dashboard metric names exist in a live chimerad scrape
	HELM=$(CACHE)/bin/helm e2e/monitoring/test-rules.sh
	HELM=$(CACHE)/bin/helm CHIMERA_REQUIRE_ENVTEST=1 nice -n 10 $(GO) test -count=1 -v \
	  -run '^(TestChartServiceMonitorSelectsTheOperatorsServices|TestChartMonitoringNeedsTheCRDsButTheDashboardDoesNot)$$' ./operator/render \
	  | tee $(CACHE)/last-monitoring-go-test.log | grep -E '^(--- |ok|FAIL|panic)'
	@test "$$(grep -c -- '^--- PASS' $(CACHE)/last-monitoring-go-test.log)" -eq 2 || { echo "test-monitoring: the chart's monitoring Go tests did not both pass"; exit 1; }
	CHIMERAD=$(CHIMERAD) python3 -m pytest -v -p no:cacheprovider e2e/monitoring
	@echo "test-monitoring: passed"
