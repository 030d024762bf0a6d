#!/bin/sh
# SPDX-License-Identifier: MIT
# A real Prometheus scrapes `stash serve --metrics` while a C worker counts
# keys; the series are read back through Prometheus' HTTP API and must say
# what the worker did: 2000 value reads and 2000 writes (1000 keys, 2 rounds;
# the counters stay once it left), a live service, a complete checkpoint.
# Usage: prometheus.sh STASH C_WORKER TESTS_DIR
set -eu
stash=$1 worker=$2 tests=$3
name=t-prom-$$
work=$(mktemp -d /tmp/stash-test-prom.XXXXXX)
serve_pid="" prom_pid=""
cleanup() {
    [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null
    [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
    "$stash" destroy "$name" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/chk"

"$stash" serve "$name" --dir "$work/chk" --interval 500ms --metrics 127.0.0.1:0 >"$work/serve.log" 2>&1 &
serve_pid=$!
# The line that names the address, once the service serves.
python3 "$tests/await_line.py" "$work/serve.log" "metrics at " "$serve_pid" >"$work/url" ||
    { cat "$work/serve.log"; exit 1; }
url=$(cat "$work/url")
target=${url#http://}
target=${target%/metrics}

"$worker" "$name" 0 1 1000 2 >"$work/worker.log" 2>&1 || { cat "$work/worker.log"; exit 1; }

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: stash
    static_configs:
      - targets: ['$target']
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$port" >"$work/prometheus.log" 2>&1 &
prom_pid=$!

python3 "$tests/prom_query.py" "http://127.0.0.1:$port" "$prom_pid" \
    'stash_worker_state_operations_total{index="0",kind="value",op="read"}=2000' \
    'stash_worker_state_operations_total{index="0",kind="value",op="write"}=2000' \
    'stash_service_up=1' \
    'stash_checkpoints_completed_total>=1' 'up{job="stash"}=1' ||
    { tail -20 "$work/prometheus.log"; exit 1; }
echo "prometheus read the service's series back"
