#!/usr/bin/env bash
# example_prometheus.sh - ctest example_fashion_mnist_mlp_prometheus: a real Prometheus server
# (Debian's `prometheus`), started on loopback, scrapes the MLP example training with
# --metrics-port, and its HTTP API must return a step counter > 0 (and at most the steps the
# example can have done). Exit 77 (skipped) where the prometheus binary is missing.
#   example_prometheus.sh <fashion_mnist_mlp> <fashion-mnist dir> <scratch dir>
set -uo pipefail
exe=$1 data=$2 work=$3
prom=$(command -v prometheus || true)
[[ -z "$prom" ]] && { echo "SKIPPED: the prometheus binary is not installed (Debian: apt-get install prometheus)"; exit 77; }
command -v curl >/dev/null || { echo "SKIPPED: curl is not installed"; exit 77; }
rm -rf "$work" && mkdir -p "$work"

# shellcheck source=tests/drivers/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"
metrics_port=$(free_port) web_port=$(free_port)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

# Long enough to be scraped several times (it is stopped once the answer is in): 50 epochs took
# about 5 s on an idle 2-core machine, less than Prometheus needs to start and scrape once.
"$exe" --data "$data" --epochs 500 --train-limit 4000 --test-limit 200 --metrics-port "$metrics_port" \
  > "$work/example.log" 2>&1 &
pids+=($!)
cat > "$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: trainkit
    static_configs:
      - targets: ['127.0.0.1:$metrics_port']
YML
"$prom" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$web_port" > "$work/prometheus.log" 2>&1 &
pids+=($!)

value=""
for _ in $(seq 120); do
  sleep 0.5
  body=$(curl -sf "http://127.0.0.1:$web_port/api/v1/query?query=trainkit_steps_total" || true)
  # {"status":"success","data":{"resultType":"vector","result":[{"metric":{...},"value":[1733.1,"123"]}]}}
  value=$(sed -n 's/.*"value":\[[0-9.e+]*,"\([0-9.e+]*\)"\].*/\1/p' <<<"$body")
  [[ -n "$value" && "$value" != "0" ]] && break
done
echo "example: $(grep -c epoch "$work/example.log") epoch(s) logged; Prometheus saw trainkit_steps_total = ${value:-nothing}"
if [[ -z "$value" || "$value" == "0" ]]; then
  echo "FAIL: Prometheus did not scrape a step counter; logs in $work"
  tail -5 "$work/example.log" "$work/prometheus.log"
  exit 1
fi
# The example cannot have done more than 500 epochs x 32 steps.
awk -v v="$value" 'BEGIN { exit !(v > 0 && v <= 16000) }' || { echo "FAIL: implausible step count $value"; exit 1; }
# The same figures straight from the example's endpoint, in the text format.
curl -sf "http://127.0.0.1:$metrics_port/metrics" | grep -E '^trainkit_(steps_total|loss|learning_rate) ' || exit 1
echo "OK"
