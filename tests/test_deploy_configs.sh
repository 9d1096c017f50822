#!/usr/bin/env bash
# deploy/: the Prometheus configuration and rules pass promtool (check config,
# check rules, and the rules' unit tests on synthetic series); the Grafana
# dashboard is valid JSON whose queries parse; every metric the rules, the
# dashboard and the autoscaler name is one a live `turbine serve` exports; the
# Kubernetes manifests validate against the Kubernetes schemas
# (tests/k8s/check.mjs, npm kubernetes-models) and agree with the server.
. "$(dirname "$0")/tb_test.sh"
P="$TURBINE_SRC/deploy/prometheus"
K="$TURBINE_SRC/tests/k8s"
PROMTOOL=$(command -v promtool || echo /usr/bin/promtool)
[ -x "$PROMTOOL" ] || { echo "test_deploy_configs: promtool absent (Debian package prometheus)"; exit 77; }
command -v node >/dev/null || { echo "test_deploy_configs: node absent"; exit 77; }
tb_test_dir deploy_configs

# Prometheus
if out=$("$PROMTOOL" check config "$P/prometheus.yml" 2>&1); then ok "promtool check config prometheus.yml"
else fail "promtool check config:"$'\n'"$out"; fi
if out=$("$PROMTOOL" check rules "$P/recording_rules.yml" "$P/alert_rules.yml" 2>&1); then
    ok "promtool check rules: $(echo "$out" | grep -o '[0-9]* rules found' | tr '\n' ' ')"
else fail "promtool check rules:"$'\n'"$out"; fi
if out=$(cd "$P" && "$PROMTOOL" test rules tests/*.yml 2>&1); then ok "promtool test rules tests/*.yml"
else fail "promtool test rules:"$'\n'"$out"; fi

# the engine the live server serves
if ! out=$("$TURBINE_BIN" build "$M/stories260K.bin" --tokenizer "$M/tok512.bin" -o "$D/s.engine" 2>&1); then
    fail "engine build:"$'\n'"$out"
    tb_test_finish test_deploy_configs
fi

# the dashboard, the metric names, Kubernetes
if [ ! -f "$K/node_modules/kubernetes-models/package.json" ] || [ ! -f "$K/node_modules/yaml/package.json" ]; then
    (cd "$K" && npm ci --no-audit --no-fund --silent) || fail "npm ci in tests/k8s"
fi
if ! [ -f "$K/node_modules/kubernetes-models/package.json" ]; then
    fail "tests/k8s/node_modules lacks kubernetes-models (npm ci there)"
elif out=$(PROMTOOL="$PROMTOOL" timeout 120 node "$K/check.mjs" "$TURBINE_SRC" "$TURBINE_BIN" "$D/s.engine" "$D" 2>&1); then
    echo "$out"
else
    echo "$out"
    fail "tests/k8s/check.mjs"
fi

# the kustomization builds, where kubectl is installed (it is optional here)
if command -v kubectl >/dev/null; then
    if out=$(kubectl kustomize "$TURBINE_SRC/deploy/k8s" 2>&1); then
        ok "kubectl kustomize deploy/k8s: $(echo "$out" | grep -c '^kind:') objects"
    else fail "kubectl kustomize deploy/k8s:"$'\n'"$out"; fi
else
    echo "note: kubectl absent, kustomize build not tried"
fi
tb_test_finish test_deploy_configs
