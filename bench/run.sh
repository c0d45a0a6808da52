#!/usr/bin/env bash
# Routing benchmark: the same seeded multimodal workload through
#   (a) direct round-robin to the simulated workers (the load generator spreads requests itself),
#   (b) mmrouter round_robin, (c) mmrouter kv with exact_accounting = false (text-prefix only),
#   (d) mmrouter kv exact, (e) sglang-router cache_aware, (f) vllm-router cache_aware,
# each against freshly started `mmrouter sim` workers (cold caches, bounded KV, a timing model),
# plus an overhead table (zero-time sims, sequential requests, text and one 150 KB image).
#
# Everything listens on 127.0.0.1 only. After the build and the PyPI installs the script re-runs
# itself inside a network namespace where only loopback exists (`unshare -rn`), so no router can
# reach the internet (sglang-router tries to fetch a tokenizer from the HF Hub at start).
#
# Usage: bench/run.sh [--quick] [--no-build] [--no-peers]
#   --quick     small workload, short runs (< 10 min on 2 cores once built and installed)
#   --no-build  use the existing target/release/mmrouter
#   --no-peers  skip sglang-router and vllm-router (rows marked n/a)
# Environment: MMROUTER_BIN (default target/release/mmrouter), LOADGEN_BIN (binary with the
#   `loadgen` and `workload` subcommands; default MMROUTER_BIN), SIM_KV_BLOCKS, SIM_TTFT_BASE_MS,
#   SIM_PREFILL_US, SIM_DECODE_MS, SGLANG_ROUTER_VERSION (0.3.2), VLLM_ROUTER_VERSION (0.1.17).
# Output: bench/results/latest.md (also printed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH="$ROOT/bench"
QUICK=0
BUILD=1
PEERS=1
PHASE=prepare
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --no-build) BUILD=0 ;;
    --no-peers) PEERS=0 ;;
    --phase=run) PHASE=run ;;
    -h | --help)
      sed -n '2,20p' "$0"
      exit 0
      ;;
    *)
      echo "unknown argument: $arg (see --help)" >&2
      exit 2
      ;;
  esac
done

MMR=${MMROUTER_BIN:-$ROOT/target/release/mmrouter}
LOADGEN=${LOADGEN_BIN:-$MMR}
SGL_VERSION=${SGLANG_ROUTER_VERSION:-0.3.2}
VLLMR_VERSION=${VLLM_ROUTER_VERSION:-0.1.17}
VENV="$BENCH/.venv"
WORK=${BENCH_WORK:-}

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---------------------------------------------------------------------------------------------
# Phase 1 (network allowed): build, install peers, then re-enter in a loopback-only namespace.
# ---------------------------------------------------------------------------------------------
install_peer() { # name package version -> writes $WORK/peer-<name>.status ("ok" or the reason)
  local name=$1 pkg=$2 version=$3 dir="$VENV/$1" status="$WORK/peer-$1.status"
  if [[ -x "$dir/bin/python" ]] && "$dir/bin/python" -m pip show "$pkg" 2>/dev/null | grep -qx "Version: $version"; then
    echo ok >"$status"
    return
  fi
  log "installing $pkg==$version into $dir (about a minute)"
  if python3 -m venv "$dir" >"$WORK/pip-$name.log" 2>&1 &&
    "$dir/bin/pip" install --disable-pip-version-check -q "$pkg==$version" >>"$WORK/pip-$name.log" 2>&1; then
    echo ok >"$status"
  else
    echo "pip install $pkg==$version failed: $(tail -n 1 "$WORK/pip-$name.log" | tr '\t|' '  ' | cut -c1-120)" >"$status"
    log "$(cat "$status")"
  fi
}

if [[ $PHASE == prepare ]]; then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/mmrouter-bench.XXXXXX")
  if [[ $BUILD == 1 ]]; then
    log "cargo build --release"
    (cd "$ROOT" && cargo build --release)
  fi
  for bin in "$MMR" "$LOADGEN"; do
    [[ -x $bin ]] || { echo "missing binary $bin (build first, or set MMROUTER_BIN / LOADGEN_BIN)" >&2; exit 2; }
  done
  if [[ $PEERS == 1 ]]; then
    install_peer sgl sglang-router "$SGL_VERSION"
    install_peer vllmr vllm-router "$VLLMR_VERSION"
  else
    echo "skipped (--no-peers)" >"$WORK/peer-sgl.status"
    echo "skipped (--no-peers)" >"$WORK/peer-vllmr.status"
  fi
  args=(--phase=run)
  [[ $QUICK == 1 ]] && args+=(--quick)
  [[ $PEERS == 0 ]] && args+=(--no-peers)
  export BENCH_WORK=$WORK MMROUTER_BIN=$MMR LOADGEN_BIN=$LOADGEN
  if unshare -rn true 2>/dev/null; then
    exec unshare -rn bash -c 'ip link set lo up 2>/dev/null || true; exec bash "$0" "$@"' "$0" "${args[@]}"
  fi
  log "unshare -rn is not available: running on the host's loopback; peers need the namespace and are skipped"
  export BENCH_NO_NETNS=1
  exec bash "$0" "${args[@]}"
fi

# ---------------------------------------------------------------------------------------------
# Phase 2 (loopback only): sims, routers, load.
# ---------------------------------------------------------------------------------------------
[[ -n $WORK && -d $WORK ]] || { echo "internal: BENCH_WORK is not set" >&2; exit 2; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 NO_PROXY='*' no_proxy='*' RUST_LOG=${RUST_LOG:-warn}
unset HTTP_PROXY HTTPS_PROXY http_proxy https_proxy ALL_PROXY all_proxy

if [[ $QUICK == 1 ]]; then
  N_SIMS=4 CONVERSATIONS=24 TURNS=3 CONCURRENCY=8 OVERHEAD_N=300
else
  N_SIMS=4 CONVERSATIONS=96 TURNS=4 CONCURRENCY=16 OVERHEAD_N=2000
fi
KV_BLOCKS=${SIM_KV_BLOCKS:-6144}
TTFT_BASE_MS=${SIM_TTFT_BASE_MS:-5}
PREFILL_US=${SIM_PREFILL_US:-20}
DECODE_MS=${SIM_DECODE_MS:-1}
MAX_TOKENS=32
SEED=7

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap 'cleanup' EXIT
trap 'cleanup; exit 130' INT TERM

# Stops the given pids (SIGTERM, then SIGKILL after 5 s) and removes them from PIDS.
stop_pids() {
  local pid i keep=()
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do [[ " $* " == *" $pid "* ]] || keep+=("$pid"); done
  PIDS=("${keep[@]+"${keep[@]}"}")
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# wait_http URL SECONDS PID: until URL answers 2xx; fails early if PID died.
wait_http() {
  local url=$1 secs=$2 pid=$3 i
  for i in $(seq 1 $((secs * 10))); do
    curl -sf -o /dev/null --max-time 1 "$url" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

SIM_HOST_ARG=()
"$MMR" sim --help 2>/dev/null | grep -q -- '--host' && SIM_HOST_ARG=(--host 127.0.0.1)

SIM_URLS=()
SIM_PIDS=()
# start_sims N TTFT_BASE_MS PREFILL_US DECODE_MS: fresh workers (cold caches).
start_sims() {
  local n=$1 ttft=$2 prefill=$3 decode=$4 i port pid
  SIM_URLS=()
  SIM_PIDS=()
  for i in $(seq 0 $((n - 1))); do
    port=$(free_port)
    "$MMR" sim "${SIM_HOST_ARG[@]+"${SIM_HOST_ARG[@]}"}" --port "$port" --name "sim$i" --block-size 16 \
      --kv-blocks "$KV_BLOCKS" --ttft-base-ms "$ttft" --prefill-us-per-token "$prefill" \
      --decode-ms-per-token "$decode" --max-output-tokens "$MAX_TOKENS" --seed "$((SEED + i))" \
      >"$WORK/sim$i.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    SIM_PIDS+=("$pid")
    SIM_URLS+=("http://127.0.0.1:$port")
  done
  for i in "${!SIM_URLS[@]}"; do
    wait_http "${SIM_URLS[$i]}/health" 60 "${SIM_PIDS[$i]}" || {
      echo "sim$i did not start: $(tail -n 3 "$WORK/sim$i.log")" >&2
      exit 1
    }
  done
}

stop_sims() { stop_pids "${SIM_PIDS[@]}"; SIM_PIDS=(); }

# Mean simulated TTFT (ms) from the sims' vLLM-named histogram, or empty when they do not export it.
sims_ttft_ms() {
  local url
  for url in "${SIM_URLS[@]}"; do curl -sf --max-time 5 "$url/metrics" || true; done |
    awk '/^vllm:time_to_first_token_seconds_sum/ {s += $NF} /^vllm:time_to_first_token_seconds_count/ {c += $NF}
         END { if (c > 0) printf "%.1f", 1000 * s / c }'
}

# Σ of a Prometheus counter family at URL.
counter_sum() {
  curl -sf --max-time 5 "$1" | awk -v name="$2" '$1 ~ "^"name"({|$)" {s += $NF} END {printf "%d", s}'
}

# write_config FILE PORT POLICY EXACT
write_config() {
  local file=$1 port=$2 policy=$3 exact=$4 i
  {
    printf '[server]\nlisten = "127.0.0.1:%s"\n\n' "$port"
    printf '[model]\ndir = "qwen3-vl"\nblock_size = 16\nexact_accounting = %s\n\n' "$exact"
    for i in "${!SIM_URLS[@]}"; do
      printf '[[workers]]\nname = "sim%s"\nurl = "%s"\n\n' "$i" "${SIM_URLS[$i]}"
    done
    printf '[routing]\npolicy = "%s"\n\n' "$policy"
    printf '[media]\nallow_cidrs = ["127.0.0.0/8"]\n'
  } >"$file"
}

ROUTER_PID=
ROUTER_URL=
ROUTER_METRICS=
ROUTER_ERR=
# start_router KIND NAME: KIND is direct | mmrouter:POLICY:EXACT | sgl | vllmr. Sets ROUTER_URL
# (empty for direct), or ROUTER_ERR with the reason it could not start.
start_router() {
  local kind=$1 name=$2 port mport status cfg
  ROUTER_PID= ROUTER_URL= ROUTER_METRICS= ROUTER_ERR=
  [[ $kind == direct ]] && return 0
  port=$(free_port)
  case "$kind" in
    mmrouter:*)
      IFS=: read -r _ policy exact <<<"$kind"
      cfg="$WORK/$name.toml"
      write_config "$cfg" "$port" "$policy" "$exact"
      "$MMR" serve --config "$cfg" >"$WORK/$name.log" 2>&1 &
      ROUTER_METRICS="http://127.0.0.1:$port/metrics"
      ;;
    sgl | vllmr)
      status=$(cat "$WORK/peer-$kind.status")
      if [[ $status != ok ]]; then ROUTER_ERR=$status; return 1; fi
      if [[ -n ${BENCH_NO_NETNS:-} ]]; then ROUTER_ERR="needs a loopback-only network namespace (unshare -rn)"; return 1; fi
      mport=$(free_port)
      local common=(--host 127.0.0.1 --port "$port" --worker-urls "${SIM_URLS[@]}" --policy cache_aware
        --cache-threshold 0.3 --balance-abs-threshold 64 --balance-rel-threshold 1.5
        --prometheus-host 127.0.0.1 --prometheus-port "$mport")
      if [[ $kind == sgl ]]; then
        "$VENV/sgl/bin/python" -m sglang_router.launch_router "${common[@]}" --log-level warn >"$WORK/$name.log" 2>&1 &
      else
        "$VENV/vllmr/bin/vllm-router" "${common[@]}" --log-level warning >"$WORK/$name.log" 2>&1 &
      fi
      ROUTER_METRICS="http://127.0.0.1:$mport/metrics"
      ;;
  esac
  ROUTER_PID=$!
  PIDS+=("$ROUTER_PID")
  ROUTER_URL="http://127.0.0.1:$port"
  if ! wait_http "$ROUTER_URL/health" 60 "$ROUTER_PID"; then
    ROUTER_ERR="did not start: $(tail -n 1 "$WORK/$name.log" | sed 's/\x1b\[[0-9;]*m//g' | tr '\t|' '  ' | cut -c1-120)"
    stop_pids "$ROUTER_PID"
    ROUTER_PID= ROUTER_URL=
    return 1
  fi
}

stop_router() { [[ -z $ROUTER_PID ]] || stop_pids "$ROUTER_PID"; ROUTER_PID=; }

# ---------------------------------------------------------------------------------------------
log "workload: $CONVERSATIONS conversations x $TURNS turns, seed $SEED"
IMAGES_DIR=${BENCH_IMAGES_DIR:-$ROOT/tests/fixtures/images}
WL_ARGS=(--seed "$SEED" --conversations "$CONVERSATIONS" --turns "$TURNS" --max-tokens "$MAX_TOKENS")
[[ -d $IMAGES_DIR ]] && WL_ARGS+=(--images-dir "$IMAGES_DIR")
"$LOADGEN" workload "${WL_ARGS[@]}" --out "$WORK/workload.jsonl" >&2
# Overhead requests are non-streaming: the proxy's own cost, without stream-flushing effects.
"$LOADGEN" workload --seed "$SEED" --shape text --conversations "$OVERHEAD_N" --max-tokens 1 --no-stream \
  --out "$WORK/overhead-text.jsonl" >&2
"$LOADGEN" workload --seed "$SEED" --shape single-image --image-bytes 150000 --conversations "$OVERHEAD_N" \
  --max-tokens 1 --no-stream --out "$WORK/overhead-image.jsonl" >&2

ROWS="$WORK/rows.tsv"
: >"$ROWS"
RUNS=(
  "direct-rr|direct|direct round-robin (no router)"
  "mmrouter-rr|mmrouter:round_robin:true|mmrouter round_robin"
  "mmrouter-kv-text|mmrouter:kv:false|mmrouter kv, text prefix only"
  "mmrouter-kv-exact|mmrouter:kv:true|mmrouter kv, exact image accounting"
  "sglang-router|sgl|sglang-router $SGL_VERSION cache_aware"
  "vllm-router|vllmr|vllm-router $VLLMR_VERSION cache_aware"
)
for run in "${RUNS[@]}"; do
  IFS='|' read -r name kind title <<<"$run"
  log "run $name: $title"
  start_sims "$N_SIMS" "$TTFT_BASE_MS" "$PREFILL_US" "$DECODE_MS"
  if ! start_router "$kind" "$name"; then
    printf '%s\t%s\tn/a (%s)\t\t\t\n' "$name" "$title" "$ROUTER_ERR" >>"$ROWS"
    log "$name: n/a ($ROUTER_ERR)"
    stop_sims
    continue
  fi
  urls=()
  if [[ $kind == direct ]]; then
    for u in "${SIM_URLS[@]}"; do urls+=(--url "$u"); done
  else
    urls=(--url "$ROUTER_URL")
  fi
  status=ok
  "$LOADGEN" loadgen "${urls[@]}" --workload "$WORK/workload.jsonl" --concurrency "$CONCURRENCY" \
    --timeout-secs 120 --label "$name" --json-out "$WORK/$name.json" >&2 || status="n/a (loadgen failed)"
  fallbacks=
  [[ $kind == mmrouter:* ]] && fallbacks=$(counter_sum "$ROUTER_METRICS" mmrouter_mm_fallback_total || true)
  ttft=$(sims_ttft_ms || true)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$title" "$status" "$WORK/$name.json" "$fallbacks" "$ttft" >>"$ROWS"
  stop_router
  stop_sims
done

# Overhead: one zero-time sim, sequential requests, direct vs through each router.
OVER="$WORK/overhead.tsv"
: >"$OVER"
log "overhead: $OVERHEAD_N sequential requests per shape, zero-time sim"
for run in "direct|direct" "mmrouter kv exact|mmrouter:kv:true" "sglang-router|sgl" "vllm-router|vllmr"; do
  IFS='|' read -r title kind <<<"$run"
  name="overhead-${kind//:/-}"
  start_sims 1 0 0 0
  if ! start_router "$kind" "$name"; then
    printf '%s\tn/a (%s)\t\t\n' "$title" "$ROUTER_ERR" >>"$OVER"
    stop_sims
    continue
  fi
  url=${ROUTER_URL:-${SIM_URLS[0]}}
  for shape in text image; do
    "$LOADGEN" loadgen --url "$url" --workload "$WORK/overhead-$shape.jsonl" --concurrency 1 \
      --timeout-secs 30 --label "$name-$shape" --json-out "$WORK/$name-$shape.json" >&2 || true
  done
  printf '%s\tok\t%s\t%s\n' "$title" "$WORK/$name-text.json" "$WORK/$name-image.json" >>"$OVER"
  stop_router
  stop_sims
done

mkdir -p "$BENCH/results"
PARAMS="$([[ $QUICK == 1 ]] && echo quick || echo full) run, $(date -u +%Y-%m-%dT%H:%MZ); $N_SIMS sims (block 16, \
kv-blocks $KV_BLOCKS, ttft-base ${TTFT_BASE_MS} ms, prefill ${PREFILL_US} us/token, decode ${DECODE_MS} ms/token, \
max $MAX_TOKENS output tokens); workload seed $SEED, $CONVERSATIONS conversations x $TURNS turns, closed loop \
concurrency $CONCURRENCY; overhead: $OVERHEAD_N sequential requests per shape on one zero-time sim"
python3 "$BENCH/report.py" --rows "$ROWS" --overhead "$OVER" --params "$PARAMS" \
  --ttft-base-ms "$TTFT_BASE_MS" --prefill-us "$PREFILL_US" >"$BENCH/results/latest.md"
cat "$BENCH/results/latest.md"
log "raw results in $WORK"
