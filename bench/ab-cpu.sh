#!/usr/bin/env bash
# Router CPU per request of two (or more) mmrouter builds, in turns, on one workload shape: what
# bench/run.sh's throughput section measures, with more requests per run and only mmrouter, so a
# change of a few percent shows over this VM's noise. Each round starts each build as a router in
# front of the same two zero-time sims, sends AB_WARMUP requests (not measured), then AB_REQUESTS
# more at concurrency AB_CONCURRENCY, and reads the router's user + system CPU from /proc around the
# measured part. Prints one line per run and each build's runs sorted, with the median.
#
#   bench/ab-cpu.sh OLD_BIN NEW_BIN [MORE_BINS...]
#
# AB_SHAPE: `mmrouter workload` arguments (default: the multi-turn shape of bench/run.sh, 2 500
# conversations of 8 turns interleaved as it interleaves them). AB_ROUNDS (3), AB_WARMUP (5000),
# AB_REQUESTS (10000), AB_CONCURRENCY (16). Everything binds 127.0.0.1: nothing leaves the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
(($# >= 2)) || { echo "usage: bench/ab-cpu.sh OLD_BIN NEW_BIN [MORE_BINS...]" >&2; exit 2; }
SHAPE=${AB_SHAPE:---shape multi-turn --turns 8 --turn-tokens 200 --conversations 2500}
ROUNDS=${AB_ROUNDS:-3} WARMUP=${AB_WARMUP:-5000} REQUESTS=${AB_REQUESTS:-10000} CONC=${AB_CONCURRENCY:-16}
W=$(mktemp -d /tmp/mmrouter-ab-cpu.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
for bin in "$@"; do [[ -x $bin ]] || { echo "ab-cpu: $bin is not an executable" >&2; exit 1; }; done
MMR=$1

AB_NAME=ab-cpu
source bench/ab-common.sh

# Clock ticks of user + system CPU a process has used.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

read -r -a shape <<<"$SHAPE"
"$MMR" workload --seed 7 "${shape[@]}" --max-tokens 1 --no-stream --out "$W/workload.jsonl" >&2
cfg="$W/router.toml"
rport=$(free_port)
printf '[server]\nlisten = "127.0.0.1:%s"\n\n[model]\ndir = "qwen3-vl"\nblock_size = 16\nexact_accounting = true\n\n' \
  "$rport" >"$cfg"
for i in 0 1; do
  port=$(free_port)
  "$MMR" sim --host 127.0.0.1 --port "$port" --name "sim$i" --block-size 16 --kv-blocks 200000 --ttft-base-ms 0 \
    --prefill-us-per-token 0 --decode-ms-per-token 0 --max-output-tokens 1 >"$W/sim$i.log" 2>&1 &
  PIDS+=($!)
  printf '[[workers]]\nname = "sim%s"\nurl = "http://127.0.0.1:%s"\n\n' "$i" "$port" >>"$cfg"
  wait_http "http://127.0.0.1:$port/health"
done
printf '[routing]\npolicy = "kv"\n' >>"$cfg"
hz=$(getconf CLK_TCK)
url="http://127.0.0.1:$rport"
for round in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    "$bin" serve --config "$cfg" >"$W/router.log" 2>&1 &
    rp=$!
    wait_http "$url/health"
    "$MMR" loadgen --url "$url" --workload "$W/workload.jsonl" --concurrency "$CONC" --max-requests "$WARMUP" \
      >/dev/null
    t0=$(ticks "$rp")
    "$MMR" loadgen --url "$url" --workload "$W/workload.jsonl" --concurrency "$CONC" --skip "$WARMUP" \
      --max-requests "$REQUESTS" --json-out "$W/run.json" >/dev/null
    t1=$(ticks "$rp")
    kill "$rp"
    wait "$rp" 2>/dev/null || true
    ok=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ok"])' "$W/run.json")
    [[ $ok == "$REQUESTS" ]] || { echo "ab-cpu: $bin answered $ok of $REQUESTS" >&2; exit 1; }
    us=$(((t1 - t0) * 1000000 / hz / REQUESTS))
    echo "round $round $bin: $us µs of router CPU per request ($((t1 - t0)) ticks)"
    printf '%s\t%s\n' "$bin" "$us" >>"$W/cpu.tsv"
  done
done
python3 - "$W/cpu.tsv" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, us = line.split("\t")
    runs.setdefault(name, []).append(int(us))
for name, us in runs.items():
    print(f"{name}: {sorted(us)} µs, median {statistics.median(us)}")
EOF
echo "raw results in $W" >&2
