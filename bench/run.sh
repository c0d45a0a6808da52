#!/usr/bin/env bash
# Routing benchmark: the same seeded multimodal workload through
#   (a) direct round-robin to the simulated workers (the load generator spreads requests itself),
#   (b) mmrouter round_robin, (c) mmrouter kv with exact_accounting = false (text-prefix only),
#   (d) mmrouter kv exact, (d') mmrouter kv exact following the sims' KV events (precise mode),
#   (e) sglang-router cache_aware, (f) vllm-router cache_aware,
# each against freshly started `mmrouter sim` workers (cold caches, bounded KV, a timing model,
# prefill contention), plus rows replaying the workload one request at a time (concurrency 1: no
# load to balance) through mmrouter kv exact (approximate and precise) and sglang-router, and straight to one sim whose KV
# cache never evicts (the workload's reuse ceiling: every block seen before is cached); then the
# precise section (bench/precise.sh): approximate and precise mode in turns, round by round; then the
# affinity section (bench/affinity.sh): image affinity on shared images and the multimodal workload; then an
# overhead table (one zero-time sim, sequential requests, text and one 150 KB image) and a
# throughput table (two zero-time sims, closed loop, concurrency 16, the same requests); then the
# replicas section (bench/replicas.sh): 1 router against 3 replicas round-robin (lone, sharing state
# through [cluster] over a real nats-server, sglang-router), with and without the sims' KV events; then
# the disagg section (bench/disagg.sh): disaggregated serving on sims in roles (prefill, decode, encode),
# the prefill policy on the multimodal workload and the encoder policy on shared images, in turns.
#
# Everything listens on 127.0.0.1 only. After the build and the PyPI installs the script re-runs
# itself inside a network namespace where only loopback exists (`unshare -rn`), so no router can
# reach the internet (sglang-router tries to fetch a tokenizer from the HF Hub at start).
#
# Exit status: 1 when any row could not be measured (a router that did not start, a loadgen run that
# failed; a peer is excused only with --no-peers), after writing the report; the log names each one.
# Also 1 when any figure is implausible (bench/plausible.py: router CPU over a run below 0 or above
# cores × its wall time, a loadgen that sent other than the requests the harness asked for, counts that
# do not add up, percentiles out of order, differences or ratios between rows of different rounds):
# then no report is written (the previous results file stays as it was) and the log names each figure
# as "implausible: SECTION / SHAPE / PATH / RUN / FIGURE = VALUE (BOUND)".
# Usage: bench/run.sh [--quick] [--no-build] [--no-peers] [--only=SECTIONS]
#   --quick     small workload, short runs (about 20 min on 2 cores once built and installed; the
#               precise, affinity and replicas sections about 4-5 min each, disagg about 6: 18 runs of
#               ~20 s, most of it 8 sims starting)
#   --no-build  use the existing target/release/mmrouter
#   --no-peers  skip sglang-router and vllm-router (rows marked n/a)
#   --only=routing,precise,affinity,overhead,throughput,replicas,disagg  run only these sections (default: all)
# Environment: MMROUTER_BIN (default target/release/mmrouter), LOADGEN_BIN (binary with the
#   `loadgen` and `workload` subcommands; default MMROUTER_BIN), SIM_KV_BLOCKS, SIM_TTFT_BASE_MS,
#   SIM_PREFILL_US, SIM_DECODE_MS, SGLANG_ROUTER_VERSION (0.3.2), VLLM_ROUTER_VERSION (0.1.17),
#   BENCH_SHAPES (comma-separated overhead/throughput shapes to keep, e.g. text,unique-2000),
#   MMROUTER_BASELINE_BIN (another mmrouter build, measured beside MMROUTER_BIN in overhead and throughput),
#   PREC_ROUNDS (rounds of the precise section), AFF_ROUNDS, AFF_PROC_GB, AFF_ENC_TOKENS and AFF_PREPROCESS_US (the
#   affinity section's rounds and its sims' processor cache in GiB and encoder cache in tokens, and their preprocessing µs per image token, default 20 as bench/preprocess-cost.py measured; the router's weight follows it), AFF_ROWS_ONLY (its rows to keep: aff,noaff,sgl,rr) and AFF_WL_ONLY (shared or multimodal), PREC_PRECISE_TOML ([routing] lines for the precise section's precise-mode router only), PREC_SIM_EVENTS=both (its sims publish KV events in approximate mode too, unread: a control for their CPU), REPL_ROUNDS (rounds of the replicas section),
#   DIS_ROUNDS, DIS_IMAGES, DIS_REQUESTS, DIS_CONCURRENCY,
#   DIS_ROLES (the disagg section's rounds, shared-images workload, concurrency and sims' roles, default "prefill prefill
#   decode decode encode encode encode encode"), DIS_QUEUE_WEIGHTS (more residency rows at these encode_queue_weight
#   values, e.g. "0.25 4"), DIS_ROWS_ONLY (its rows to keep: kv,text,rr,residency,ring,residency-qwW) and DIS_WL_ONLY
#   (prefill or encode), REPL_ROWS_ONLY (its rows to keep: one,lone,cluster,sgl; shadow, a control run only when named: 1 router + 2 idle replicas following the feeds), REPL_MODES_ONLY (its modes: "approximate
#   precise"), REPL_WL_EXTRA (more `workload` options for it, e.g. "--fallback-fraction 0"), BENCH_ROUTING_TOML (lines added to every mmrouter's [routing], e.g.
#   "eviction_weight = 0"), BENCH_OUT (write the report here instead of bench/results/*.md),
#   BENCH_CORRUPT=FIGURE (a test of the harness, see bench/test-harness.sh: corrupts the first measurement
#   of FIGURE through a router where it is recorded, and the run must fail naming it; FIGURE is
#   router-cpu (+1000 s of router CPU in a throughput run), router-cpu-negative (that reading negated),
#   requests (an overhead report one request short of what the harness asked for), latency (an overhead
#   report's p50 above its p99) or round (an overhead report filed under the next round's id)).
# Output: bench/results/latest.md (also printed); bench/results/partial.md for --only or BENCH_SHAPES.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH="$ROOT/bench"
QUICK=0
BUILD=1
PEERS=1
ALL_SECTIONS=routing,precise,affinity,overhead,throughput,replicas,disagg
ONLY=$ALL_SECTIONS
PHASE=prepare
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    --no-build) BUILD=0 ;;
    --no-peers) PEERS=0 ;;
    --only=*) ONLY=${arg#--only=} ;;
    --phase=run) PHASE=run ;;
    -h | --help)
      sed -n '2,57p' "$0"
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
section_on() { [[ ",$ONLY," == *",$1,"* ]]; }
# Failures are collected (the run goes on so the report shows every row) and make the script exit 1
# at the end, naming the phase and the reason. An unexpected command failure names its line at once.
FAILURES=()
fail() { FAILURES+=("$1: $2"); log "FAILED $1: $2"; }
# An mmrouter or direct row must run; a peer may be missing only when --no-peers skipped it.
unavailable_is_failure() { [[ $1 != sgl && $1 != vllmr ]] || [[ $PEERS == 1 ]]; }
trap 'log "FAILED: unexpected error at line $LINENO (exit $?)"' ERR
# The replicas section's functions (replicas_prepare in phase 1, replicas_section in phase 2).
# shellcheck source=bench/replicas.sh
source "$BENCH/replicas.sh"
# The precise section's functions (precise mode against approximate mode, in turns).
# shellcheck source=bench/precise.sh
source "$BENCH/precise.sh"
# The affinity section's functions (image affinity on shared images and the multimodal workload).
# shellcheck source=bench/affinity.sh
source "$BENCH/affinity.sh"
# The disagg section's functions (disaggregated serving on sims in roles).
# shellcheck source=bench/disagg.sh
source "$BENCH/disagg.sh"

# ---------------------------------------------------------------------------------------------
# Phase 1 (network allowed): build, install peers, then re-enter in a loopback-only namespace.
# ---------------------------------------------------------------------------------------------
install_peer() { # name package version -> writes $WORK/peer-<name>.status ("ok" or the reason)
  local name=$1 pkg=$2 version=$3 dir="$VENV/$1" status="$WORK/peer-$1.status"
  # Read the whole `pip show` output: `grep -q` would close the pipe early and, under pipefail, turn
  # pip's SIGPIPE into a failed check (and a needless reinstall).
  if [[ -x "$dir/bin/python" ]] &&
    [[ $("$dir/bin/python" -m pip show "$pkg" 2>/dev/null | sed -n 's/^Version: //p') == "$version" ]]; then
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
  export BENCH_START=${BENCH_START:-$(date +%s)}
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
  if section_on replicas; then replicas_prepare; fi
  args=(--phase=run)
  [[ $QUICK == 1 ]] && args+=(--quick)
  [[ $PEERS == 0 ]] && args+=(--no-peers)
  args+=("--only=$ONLY")
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

# THRU_*: requests per measured throughput repetition (THRU_REPS of them, after a warm-up of
# THRU_WARMUP); the text requests are small and fast, so they get more to last long enough to time.
if [[ $QUICK == 1 ]]; then
  N_SIMS=4 CONVERSATIONS=24 TURNS=3 CONCURRENCY=8 OVERHEAD_N=600
  THRU_TEXT_N=3000 THRU_IMAGE_N=600 THRU_U500_N=1000 THRU_U2000_N=500 THRU_U8000_N=150 THRU_MT_N=800 THRU_REPS=5
else
  N_SIMS=4 CONVERSATIONS=96 TURNS=4 CONCURRENCY=16 OVERHEAD_N=2000
  THRU_TEXT_N=20000 THRU_IMAGE_N=2000 THRU_U500_N=4000 THRU_U2000_N=2000 THRU_U8000_N=500 THRU_MT_N=3000
  THRU_REPS=5
fi
# REPL_*: the replicas section's workload (the routing one's generator and seed) and rounds.
if [[ $QUICK == 1 ]]; then
  REPL_CONVERSATIONS=48 REPL_TURNS=4 REPL_CONCURRENCY=8 REPL_ROUNDS=${REPL_ROUNDS:-3}
else
  REPL_CONVERSATIONS=96 REPL_TURNS=4 REPL_CONCURRENCY=16 REPL_ROUNDS=${REPL_ROUNDS:-5}
fi
# PREC_ROUNDS: rounds of the precise section (each runs both modes at both concurrencies).
if [[ $QUICK == 1 ]]; then PREC_ROUNDS=${PREC_ROUNDS:-5}; else PREC_ROUNDS=${PREC_ROUNDS:-3}; fi
# AFF_*: the affinity section's shared-images workload, concurrency, sims' processor cache and rounds.
if [[ $QUICK == 1 ]]; then
  AFF_IMAGES=24 AFF_REQUESTS=240 AFF_CONCURRENCY=8 AFF_ROUNDS=${AFF_ROUNDS:-3}
else
  AFF_IMAGES=24 AFF_REQUESTS=480 AFF_CONCURRENCY=16 AFF_ROUNDS=${AFF_ROUNDS:-3}
fi
AFF_PROC_GB=${AFF_PROC_GB:-1} AFF_ENC_TOKENS=${AFF_ENC_TOKENS:-49152}
# DIS_*: the disagg section's shared-images workload, concurrency and rounds. DIS_IMAGES images of
# DIS_IMAGE_PX² pixels (1024 encoder tokens each): 40 is 2.5 times what one encoder's cache holds (the sims'
# default 16384 tokens: 16 images) and 5/8 of what the 4 encoders hold together (64), so an image sent
# back to the encoder that encoded it hits, and one sent anywhere misses about 60 % of the time.
# Concurrency 4: the two prefill sims serve ~66 requests/s of that shape (5 ms + ~1 260 tokens × 20 µs);
# a closed loop that saturates them has a mean latency of concurrency / throughput whatever the encoders do.
if [[ $QUICK == 1 ]]; then
  DIS_REQUESTS=${DIS_REQUESTS:-240} DIS_ROUNDS=${DIS_ROUNDS:-3}
else
  DIS_REQUESTS=${DIS_REQUESTS:-480} DIS_ROUNDS=${DIS_ROUNDS:-5}
fi
DIS_IMAGES=${DIS_IMAGES:-40} DIS_IMAGE_PX=${DIS_IMAGE_PX:-1024} DIS_CONCURRENCY=${DIS_CONCURRENCY:-4}
THRU_SIMS=2 THRU_CONCURRENCY=16 THRU_WARMUP=200 OVERHEAD_WARMUP=50
KV_BLOCKS=${SIM_KV_BLOCKS:-6144}
CEILING_KV_BLOCKS=4000000 # 64M tokens: far more than any workload here, so nothing is evicted
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
SIM_EVENTS=()
SIM_EXTRA_ARGS=() # more `mmrouter sim` options for the sims started next (the affinity section's caches)
SIM_ROLES=()      # each sim's role (the disagg section's sims; empty: role both, not written)
# start_sims N TTFT_BASE_MS PREFILL_US DECODE_MS [KV_BLOCKS] [events]: fresh workers (cold caches);
# with "events" each publishes its KV events (vLLM map form) on its own loopback port (SIM_EVENTS).
start_sims() {
  local n=$1 ttft=$2 prefill=$3 decode=$4 kv=${5:-$KV_BLOCKS} events=${6:-} i port pid ev
  SIM_URLS=()
  SIM_PIDS=()
  SIM_EVENTS=()
  SIM_ROLES=()
  for i in $(seq 0 $((n - 1))); do
    port=$(free_port)
    ev=()
    if [[ $events == events ]]; then
      SIM_EVENTS+=("tcp://127.0.0.1:$(free_port)")
      ev=(--kv-events "${SIM_EVENTS[$i]}")
    fi
    "$MMR" sim "${SIM_HOST_ARG[@]+"${SIM_HOST_ARG[@]}"}" --port "$port" --name "sim$i" --block-size 16 \
      --kv-blocks "$kv" --ttft-base-ms "$ttft" --prefill-us-per-token "$prefill" \
      --decode-ms-per-token "$decode" --max-output-tokens "$MAX_TOKENS" --seed "$((SEED + i))" \
      "${ev[@]+"${ev[@]}"}" "${SIM_EXTRA_ARGS[@]+"${SIM_EXTRA_ARGS[@]}"}" >"$WORK/sim$i.log" 2>&1 &
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

# sims_counters [NAME]: reads every current sim's /metrics once (saved as $WORK/NAME-simK.prom when NAME
# is given) and sets SIMS_HITS and SIMS_PROMPT (Σ vllm:prefix_cache_hits_total and prompt_tokens_total),
# SIMS_SPLIT (each sim's prompt tokens, comma-separated), SIMS_MM_Q / SIMS_MM_H (Σ vllm:mm_cache_queries /
# hits) and SIMS_ENC_Q / SIMS_ENC_H (Σ sim_encoder_cache_queries / hits).
sims_counters() {
  local i page k
  SIMS_HITS=0 SIMS_PROMPT=0 SIMS_SPLIT= SIMS_MM_Q=0 SIMS_MM_H=0 SIMS_ENC_Q=0 SIMS_ENC_H=0
  for i in "${!SIM_URLS[@]}"; do
    page=$(curl -sf --max-time 5 "${SIM_URLS[$i]}/metrics" || true)
    [[ -z ${1:-} ]] || printf '%s\n' "$page" >"$WORK/$1-sim$i.prom"
    k=$(page_sum "$page" 'vllm:prefix_cache_hits_total'); SIMS_HITS=$((SIMS_HITS + k))
    k=$(page_sum "$page" 'vllm:prompt_tokens_total'); SIMS_PROMPT=$((SIMS_PROMPT + k)) SIMS_SPLIT+="${SIMS_SPLIT:+,}$k"
    k=$(page_sum "$page" 'vllm:mm_cache_queries_total'); SIMS_MM_Q=$((SIMS_MM_Q + k))
    k=$(page_sum "$page" 'vllm:mm_cache_hits_total'); SIMS_MM_H=$((SIMS_MM_H + k))
    k=$(page_sum "$page" 'sim_encoder_cache_queries_total'); SIMS_ENC_Q=$((SIMS_ENC_Q + k))
    k=$(page_sum "$page" 'sim_encoder_cache_hits_total'); SIMS_ENC_H=$((SIMS_ENC_H + k))
  done
}
# page_sum PAGE NAME: Σ of a counter family in a Prometheus page (0 when absent).
page_sum() {
  awk -v name="$2" '$1 ~ "^"name"({|$)" {s += $NF} END {printf "%d", s}' <<<"$1"
}

# write_config FILE PORT POLICY EXACT
write_config() {
  local file=$1 port=$2 policy=$3 exact=$4 i
  {
    printf '[server]\nlisten = "127.0.0.1:%s"\n\n' "$port"
    printf '[model]\ndir = "qwen3-vl"\nblock_size = 16\nexact_accounting = %s\n\n' "$exact"
    for i in "${!SIM_URLS[@]}"; do
      printf '[[workers]]\nname = "sim%s"\nurl = "%s"\n' "$i" "${SIM_URLS[$i]}"
      [[ -z ${SIM_EVENTS[$i]:-} ]] || printf 'kv_events = "%s"\n' "${SIM_EVENTS[$i]}"
      [[ -z ${SIM_ROLES[$i]:-} ]] || printf 'role = "%s"\n' "${SIM_ROLES[$i]}"
      printf '\n'
    done
    printf '[routing]\npolicy = "%s"\n' "$policy"
    [[ -z ${BENCH_ROUTING_TOML:-} ]] || printf '%s\n' "$BENCH_ROUTING_TOML"
    # More [routing] lines for this router only (the affinity section's rows).
    [[ -z ${ROUTER_ROUTING_TOML:-} ]] || printf '%s\n' "$ROUTER_ROUTING_TOML"
    printf '\n'
    # A pixel limit below the workload's fallback photos (24 MP and up) and above every other image:
    # the router falls back on them, the sims (like vLLM) serve them.
    printf '[media]\nallow_cidrs = ["127.0.0.0/8"]\nmax_pixels = 16000000\n'
    # More sections for this router only (the replicas section's [cluster]).
    [[ -z ${ROUTER_EXTRA_TOML:-} ]] || printf '\n%s\n' "$ROUTER_EXTRA_TOML"
  } >"$file"
}

ROUTER_PID=
ROUTER_URL=
ROUTER_METRICS=
ROUTER_ERR=
# start_router KIND NAME: KIND is direct | mmrouter:POLICY:EXACT[:events] | sgl | vllmr. Sets ROUTER_URL
# (empty for direct), or ROUTER_ERR with the reason it could not start.
start_router() {
  local kind=$1 name=$2 port mport status cfg
  ROUTER_PID= ROUTER_URL= ROUTER_METRICS= ROUTER_ERR=
  [[ $kind == direct ]] && return 0
  port=$(free_port)
  case "$kind" in
    mmrouter:*)
      IFS=: read -r _ policy exact _ <<<"$kind"
      cfg="$WORK/$name.toml"
      write_config "$cfg" "$port" "$policy" "$exact"
      local bin=$MMR
      [[ $kind == *:base ]] && bin=$MMROUTER_BASELINE_BIN
      "$bin" serve --config "$cfg" >"$WORK/$name.log" 2>&1 &
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

# cpu_ticks PID: Σ utime + stime + cutime + cstime (clock ticks) of PID and its descendants, from one
# pass over /proc; prints nothing when PID is gone (no reading rather than a wrong one).
# A process anywhere on the machine that exits between the glob and its read makes cat fail; that is
# expected and must not change the sum. (Callers once wrote `cpu_ticks PID || echo 0`: under pipefail
# cat's failure appended a "0" to the sum awk had already printed, a reading ten times too large, and
# the run's CPU delta came out hugely positive or negative.) cutime + cstime keep the time of children
# that exit and are reaped during the interval in the sum.
cpu_ticks() {
  { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v root="$1" '
    { pid = $1; sub(/^.*\) /, ""); parent[pid] = $2; ticks[pid] = $12 + $13 + $14 + $15 }
    END {
      if (!(root in parent)) exit
      mine[root] = 1
      for (grew = 1; grew;) { grew = 0; for (p in parent) if (!(p in mine) && (parent[p] in mine)) { mine[p] = 1; grew = 1 } }
      for (p in mine) s += ticks[p]
      printf "%d", s
    }'
}
CLK_TCK=$(getconf CLK_TCK)
# router_ticks PATH-INDEX: cpu_ticks of the path's router; nothing for direct or a router that is gone.
router_ticks() { [[ -z ${P_ROUTER[$1]} ]] || cpu_ticks "${P_ROUTER[$1]}"; }
# run_cpu PATH-INDEX T0 T1: the router's CPU ticks over one run: "-" for direct (no router), "gone"
# when a reading is missing (the process died), never a substitute value.
run_cpu() {
  local cpu
  if [[ -z ${P_ROUTER[$1]} ]]; then echo -; return; fi
  if [[ -z $2 || -z $3 ]]; then echo gone; return; fi
  cpu=$(($3 - $2))
  if corrupt_now router-cpu; then cpu=$((cpu + 1000 * CLK_TCK)); fi
  if corrupt_now router-cpu-negative; then cpu=$((-cpu - 1)); fi
  echo "$cpu"
}

# BENCH_CORRUPT=FIGURE, a test of the harness (bench/test-harness.sh): the first measurement of FIGURE
# through a router is corrupted where it is recorded, and the run must fail naming it.
CORRUPT_FIGURES="router-cpu router-cpu-negative requests latency round"
if [[ -n ${BENCH_CORRUPT:-} && " $CORRUPT_FIGURES " != *" $BENCH_CORRUPT "* ]]; then
  echo "BENCH_CORRUPT=$BENCH_CORRUPT: not one of $CORRUPT_FIGURES" >&2
  exit 2
fi
# corrupt_now FIGURE: true once per run, when BENCH_CORRUPT names FIGURE. A marker file, not a
# variable: callers run in command substitutions, whose variables do not come back.
corrupt_now() {
  [[ ${BENCH_CORRUPT:-} == "$1" && ! -e $WORK/corrupted ]] || return 1
  echo "$1" >"$WORK/corrupted"
}
# edit_report FILE STATEMENT: rewrites a loadgen JSON report, STATEMENT changing `r` (harness tests only).
edit_report() {
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(r, open(sys.argv[1], "w"))' "$1" "$2"
}
# corrupt_overhead FILE ROUND: prints the round id to file FILE under, after any corruption of it: the
# loadgen's count one short (requests), p50 above p99 (latency), or the next round's id (round).
corrupt_overhead() {
  local file=$1 round=$2
  case ${BENCH_CORRUPT:-} in
    requests | latency | round) corrupt_now "$BENCH_CORRUPT" || { echo "$round"; return; } ;;
    *) echo "$round"; return ;;
  esac
  case $BENCH_CORRUPT in
    # One request short, the report otherwise self-consistent: only the harness's own count can tell.
    requests) edit_report "$file" 'r["requests"] -= 1; r["ok"] -= 1; r["latency_ms"]["count"] -= 1
r["ttfb_ms"]["count"] = min(r["ttfb_ms"]["count"], r["ok"]); r["throughput_rps"] = r["ok"] / r["duration_secs"]' ;;
    latency) edit_report "$file" 'r["latency_ms"]["p50"] = 2 * r["latency_ms"]["p99"]' ;;
    round) round=$((round % OVER_ROUNDS + 1)) ;;
  esac
  echo "$round"
}

# ---------------------------------------------------------------------------------------------
log "workload: $CONVERSATIONS conversations x $TURNS turns, seed $SEED"
IMAGES_DIR=${BENCH_IMAGES_DIR:-$ROOT/tests/fixtures/images}
WL_ARGS=(--seed "$SEED" --conversations "$CONVERSATIONS" --turns "$TURNS" --max-tokens "$MAX_TOKENS")
[[ -d $IMAGES_DIR ]] && WL_ARGS+=(--images-dir "$IMAGES_DIR")
{ section_on routing || section_on precise || section_on affinity || section_on disagg; } && "$LOADGEN" workload "${WL_ARGS[@]}" --out "$WORK/workload.jsonl" >&2
if section_on replicas; then
  REPL_WL_ARGS=(--seed "$SEED" --conversations "$REPL_CONVERSATIONS" --turns "$REPL_TURNS" --max-tokens "$MAX_TOKENS" ${REPL_WL_EXTRA:-})
  [[ -d $IMAGES_DIR ]] && REPL_WL_ARGS+=(--images-dir "$IMAGES_DIR")
  "$LOADGEN" workload "${REPL_WL_ARGS[@]}" --out "$WORK/replicas-workload.jsonl" >&2
fi
# Overhead and throughput requests are non-streaming: the proxy's own cost, without stream-flushing
# effects. Shapes (name|workload options|overhead requests|throughput requests per run): two repeat one
# body (every router cache hits: "cache hit" rows); the others are new text on every request, as real
# traffic is: one-shot prompts of ~500/2000/8000 tokens and conversations resending their history with one
# new ~200-token turn. Each run against one router process starts where the previous one stopped
# (loadgen --skip), so a unique shape never repeats a request to the same router.
repeats() { [[ $1 == text || $1 == image ]]; }
# first_line SHAPE LINE: where a run that would start at LINE starts (0 for a repeated body).
first_line() { if repeats "$1"; then echo 0; else echo "$2"; fi; }
SHAPES=(
  "text|--shape text|$OVERHEAD_N|$THRU_TEXT_N"
  "image|--shape single-image --image-bytes 150000|$OVERHEAD_N|$THRU_IMAGE_N"
  "unique-500|--shape unique-text --prompt-tokens 500|$OVERHEAD_N|$THRU_U500_N"
  "unique-2000|--shape unique-text --prompt-tokens 2000|$((OVERHEAD_N / 2))|$THRU_U2000_N"
  "unique-8000|--shape unique-text --prompt-tokens 8000|$((OVERHEAD_N / 4))|$THRU_U8000_N"
  "multi-turn|--shape multi-turn --turns 8 --turn-tokens 200|$((OVERHEAD_N / 2))|$THRU_MT_N"
)
if [[ -n ${BENCH_SHAPES:-} ]]; then
  kept=()
  for sh in "${SHAPES[@]}"; do [[ ",$BENCH_SHAPES," == *",${sh%%|*},"* ]] && kept+=("$sh"); done
  SHAPES=("${kept[@]+"${kept[@]}"}")
fi
OVER_COUNTS= THRU_COUNTS=
for sh in "${SHAPES[@]}"; do
  IFS='|' read -r shape wl over_n thru_n <<<"$sh"
  OVER_COUNTS+="${OVER_COUNTS:+ / }$shape $over_n" THRU_COUNTS+="${THRU_COUNTS:+ / }$shape $thru_n"
  need=$((OVERHEAD_WARMUP + over_n > THRU_WARMUP + THRU_REPS * thru_n ? OVERHEAD_WARMUP + over_n : THRU_WARMUP + THRU_REPS * thru_n))
  # A repeated body needs only as many lines as the longest single run.
  repeats "$shape" && need=$((OVERHEAD_WARMUP + over_n > thru_n ? OVERHEAD_WARMUP + over_n : thru_n))
  read -ra wl_args <<<"$wl"
  [[ $shape == multi-turn ]] && need=$(((need + 7) / 8)) # conversations of 8 turns
  "$LOADGEN" workload --seed "$SEED" "${wl_args[@]}" --conversations "$need" --max-tokens 1 --no-stream \
    --out "$WORK/shape-$shape.jsonl" >&2
done

ROWS="$WORK/rows.tsv"
: >"$ROWS"
# name|kind|title|concurrency (empty: $CONCURRENCY)
RUNS=(
  "direct-rr|direct|direct round-robin (no router)|"
  "mmrouter-rr|mmrouter:round_robin:true|mmrouter round_robin|"
  "mmrouter-kv-text|mmrouter:kv:false|mmrouter kv, text prefix only|"
  "mmrouter-kv-exact|mmrouter:kv:true|mmrouter kv, exact image accounting|"
  "mmrouter-kv-events|mmrouter:kv:true:events|mmrouter kv exact, precise (workers' KV events)|"
  "sglang-router|sgl|sglang-router $SGL_VERSION cache_aware|"
  "vllm-router|vllmr|vllm-router $VLLMR_VERSION cache_aware|"
  "mmrouter-kv-exact-c1|mmrouter:kv:true|mmrouter kv exact, concurrency 1|1"
  "mmrouter-kv-events-c1|mmrouter:kv:true:events|mmrouter kv exact precise (KV events), concurrency 1|1"
  "sglang-router-c1|sgl|sglang-router cache_aware, concurrency 1|1"
  "reuse-ceiling|ceiling|reuse ceiling: one sim, KV never evicts, concurrency 1 (no router)|1"
)
for run in "${RUNS[@]}"; do
  section_on routing || break
  IFS='|' read -r name kind title conc <<<"$run"
  conc=${conc:-$CONCURRENCY}
  log "run $name: $title (concurrency $conc)"
  if [[ $kind == ceiling ]]; then
    kind=direct
    start_sims 1 "$TTFT_BASE_MS" "$PREFILL_US" "$DECODE_MS" "$CEILING_KV_BLOCKS"
  else
    start_sims "$N_SIMS" "$TTFT_BASE_MS" "$PREFILL_US" "$DECODE_MS" "$KV_BLOCKS" "${kind##*:}"
  fi
  if ! start_router "$kind" "$name"; then
    printf '%s\t%s\tn/a (%s)\t\t\t\n' "$name" "$title" "$ROUTER_ERR" >>"$ROWS"
    unavailable_is_failure "$kind" && fail "routing row $name" "$ROUTER_ERR"
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
  "$LOADGEN" loadgen "${urls[@]}" --workload "$WORK/workload.jsonl" --concurrency "$conc" \
    --timeout-secs 120 --label "$name" --json-out "$WORK/$name.json" >&2 || {
    status="n/a (loadgen failed)"
    fail "routing row $name" "loadgen failed (see the log above)"
  }
  fallbacks=
  [[ $kind == mmrouter:* ]] && fallbacks=$(counter_sum "$ROUTER_METRICS" mmrouter_mm_fallback_total || true)
  ttft=$(sims_ttft_ms || true)
  # How the prompt tokens spread over the sims (any router, from the sims' own counters).
  split=$(for u in "${SIM_URLS[@]}"; do counter_sum "$u/metrics" 'vllm:prompt_tokens_total' || true; echo; done |
    paste -sd, -)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$title" "$status" "$WORK/$name.json" "$fallbacks" "$ttft" \
    "$split" >>"$ROWS"
  stop_router
  stop_sims
done

# Precise mode against approximate mode, in turns (bench/precise.sh).
PREC="$WORK/precise.tsv"
: >"$PREC"
if section_on precise; then precise_section; fi

# Image affinity: shared images and the multimodal workload (bench/affinity.sh).
AFF="$WORK/affinity.tsv"
: >"$AFF"
if section_on affinity; then affinity_section; fi

# Replicas: 1 router against 3 replicas behind a round-robin address (bench/replicas.sh).
REPL="$WORK/replicas.tsv"
: >"$REPL"
if section_on replicas; then replicas_section; fi

# Disaggregated serving on sims in roles: prefill and encoder policies (bench/disagg.sh).
DIS="$WORK/disagg.tsv"
: >"$DIS"
if section_on disagg; then disagg_section; fi

# The overhead and throughput sections start every path at once (each with its own fresh sims) and
# take turns: round r sends the same slice of requests through each path in a rotated order. On a
# shared 2-vCPU machine whose speed drifts by tens of percent within minutes, paths measured minutes
# apart are not comparable; paths measured seconds apart, round after round, are.
PATHS=("direct|direct" "mmrouter kv exact|mmrouter:kv:true" "sglang-router|sgl" "vllm-router|vllmr")
# A second mmrouter build side by side (before/after a change): MMROUTER_BASELINE_BIN=path/to/old/mmrouter.
[[ -z ${MMROUTER_BASELINE_BIN:-} ]] || PATHS+=("mmrouter kv exact, baseline binary|mmrouter:kv:true:base")
# start_paths NSIMS SECTION: fills P_TITLE, P_KIND, P_NAME, P_URLS (loadgen --url args), P_ROUTER (pid,
# empty for direct), P_SIMS (pids), P_METRICS, P_ERR (why the path is unavailable, else empty).
start_paths() {
  local nsims=$1 section=$2 run title kind name
  P_TITLE=() P_KIND=() P_NAME=() P_URLS=() P_ROUTER=() P_SIMS=() P_METRICS=() P_ERR=()
  for run in "${PATHS[@]}"; do
    IFS='|' read -r title kind <<<"$run"
    name="$section-${kind//:/-}"
    start_sims "$nsims" 0 0 0
    P_TITLE+=("$title") P_KIND+=("$kind") P_NAME+=("$name") P_SIMS+=("${SIM_PIDS[*]}")
    if ! start_router "$kind" "$name"; then
      P_ERR+=("$ROUTER_ERR") P_URLS+=("") P_ROUTER+=("") P_METRICS+=("")
      unavailable_is_failure "$kind" && fail "$section $name" "$ROUTER_ERR"
      stop_sims
      continue
    fi
    P_ERR+=("") P_ROUTER+=("$ROUTER_PID") P_METRICS+=("$ROUTER_METRICS")
    if [[ $kind == direct ]]; then P_URLS+=("$(printf -- '--url %s ' "${SIM_URLS[@]}")"); else P_URLS+=("--url $ROUTER_URL"); fi
  done
}
stop_paths() {
  local p pids=()
  for p in "${P_ROUTER[@]}" ${P_SIMS[*]}; do [[ -n $p ]] && pids+=("$p"); done
  ((${#pids[@]} == 0)) || stop_pids "${pids[@]}"
  SIM_PIDS=()
}
# live_paths ROUND: indices of the started paths, rotated by ROUND (each path leads in turn).
live_paths() {
  local n=${#P_TITLE[@]} k i
  for k in $(seq 0 $((n - 1))); do
    i=$(((k + $1) % n))
    [[ -n ${P_ERR[$i]} ]] || echo "$i"
  done
}
unavailable_rows() { # FILE: one row per path that did not start
  local i
  for i in "${!P_TITLE[@]}"; do
    [[ -z ${P_ERR[$i]} ]] || printf '%s\t%s\tn/a (%s)\t\t\n' "${P_TITLE[$i]}" "-" "${P_ERR[$i]}" >>"$1"
  done
}

# Overhead: one zero-time sim per path, sequential requests, in OVER_ROUNDS interleaved slices.
OVER="$WORK/overhead.tsv"
: >"$OVER"
OVER_ROUNDS=5
if section_on overhead; then
  log "overhead: sequential requests per shape (after $OVERHEAD_WARMUP unmeasured), $OVER_ROUNDS interleaved rounds"
  start_paths 1 overhead
  for sh in "${SHAPES[@]}"; do
    IFS='|' read -r shape _ over_n _ <<<"$sh"
    slice=$((over_n / OVER_ROUNDS))
    declare -A files=() rounds=()
    for i in $(live_paths 0); do
      # Warm-up (connections, caches), not measured.
      # shellcheck disable=SC2086
      "$LOADGEN" loadgen ${P_URLS[$i]} --workload "$WORK/shape-$shape.jsonl" --concurrency 1 \
        --max-requests "$OVERHEAD_WARMUP" --timeout-secs 30 --label warmup >/dev/null 2>&1 || true
      # mmrouter's own stage histograms around the measured requests (report.py takes the difference).
      [[ ${P_KIND[$i]} == mmrouter:* ]] && { curl -sf --max-time 5 "${P_METRICS[$i]}" >"$WORK/${P_NAME[$i]}-$shape.before.prom" || true; }
    done
    for round in $(seq 1 "$OVER_ROUNDS"); do
      skip=$(first_line "$shape" $((OVERHEAD_WARMUP + (round - 1) * slice)))
      for i in $(live_paths "$round"); do
        out="$WORK/${P_NAME[$i]}-$shape-$round.json"
        # shellcheck disable=SC2086
        "$LOADGEN" loadgen ${P_URLS[$i]} --workload "$WORK/shape-$shape.jsonl" --concurrency 1 --skip "$skip" \
          --max-requests "$slice" --timeout-secs 30 --label "${P_NAME[$i]}-$shape-$round" --json-out "$out" \
          >/dev/null 2>&1 || fail "overhead ${P_NAME[$i]}-$shape-$round" "loadgen failed"
        filed=$round
        [[ -z ${P_ROUTER[$i]} ]] || filed=$(corrupt_overhead "$out" "$round")
        files[$i]+="${files[$i]:+,}$out" rounds[$i]+="${rounds[$i]:+,}$filed"
      done
    done
    for i in $(live_paths 0); do
      [[ ${P_KIND[$i]} == mmrouter:* ]] && { curl -sf --max-time 5 "${P_METRICS[$i]}" >"$WORK/${P_NAME[$i]}-$shape.after.prom" || true; }
      printf '%s\t%s\tok\t%s\t%s\t%s\n' "${P_TITLE[$i]}" "$shape" "${files[$i]}" "${rounds[$i]}" "$slice" >>"$OVER"
    done
    unset files rounds
  done
  unavailable_rows "$OVER"
  stop_paths
fi

# Throughput: two zero-time sims per path, closed loop; direct spreads round-robin over both sims
# itself. Run r of every path, in a rotated order, before run r+1 of any.
THRU="$WORK/throughput.tsv"
: >"$THRU"
if section_on throughput; then
  log "throughput: $THRU_REPS interleaved runs per shape, concurrency $THRU_CONCURRENCY, $THRU_SIMS zero-time sims per path"
  start_paths "$THRU_SIMS" throughput
  for sh in "${SHAPES[@]}"; do
    IFS='|' read -r shape _ _ n <<<"$sh"
    declare -A files=() rounds=() cpus=() walls=()
    for i in $(live_paths 0); do
      # shellcheck disable=SC2086
      "$LOADGEN" loadgen ${P_URLS[$i]} --workload "$WORK/shape-$shape.jsonl" --concurrency "$THRU_CONCURRENCY" \
        --max-requests "$THRU_WARMUP" --timeout-secs 30 --label warmup >/dev/null 2>&1 || true
    done
    for rep in $(seq 1 "$THRU_REPS"); do
      skip=$(first_line "$shape" $((THRU_WARMUP + (rep - 1) * n)))
      for i in $(live_paths "$rep"); do
        out="$WORK/${P_NAME[$i]}-$shape-$rep.json"
        # The wall clock brackets both /proc readings, so the CPU between them fits cores × that wall.
        w0=${EPOCHREALTIME/[.,]/}
        t0=$(router_ticks "$i")
        # shellcheck disable=SC2086
        "$LOADGEN" loadgen ${P_URLS[$i]} --workload "$WORK/shape-$shape.jsonl" --concurrency "$THRU_CONCURRENCY" \
          --skip "$skip" --max-requests "$n" --timeout-secs 30 --label "${P_NAME[$i]}-$shape-$rep" \
          --json-out "$out" >/dev/null 2>&1 || fail "throughput ${P_NAME[$i]}-$shape-$rep" "loadgen failed"
        t1=$(router_ticks "$i")
        w1=${EPOCHREALTIME/[.,]/}
        files[$i]+="${files[$i]:+,}$out" rounds[$i]+="${rounds[$i]:+,}$rep"
        cpus[$i]+="${cpus[$i]:+,}$(run_cpu "$i" "$t0" "$t1")" walls[$i]+="${walls[$i]:+,}$((w1 - w0))"
      done
    done
    for i in $(live_paths 0); do
      # The router's CPU ticks per run ("-" for direct) and the wall µs around each: report.py checks
      # one against the other and divides the CPU by the loadgen's own request counts.
      printf '%s\t%s\tok\t%s\t%s\t%s\t%s\t%s\n' "${P_TITLE[$i]}" "$shape" "${files[$i]}" "${rounds[$i]}" \
        "${cpus[$i]}" "${walls[$i]}" "$n" >>"$THRU"
    done
    unset files rounds cpus walls
  done
  unavailable_rows "$THRU"
  stop_paths
fi

mkdir -p "$BENCH/results"
ELAPSED=$(($(date +%s) - ${BENCH_START:-$(date +%s)}))
PARAMS="$([[ $QUICK == 1 ]] && echo quick || echo full) run, $(date -u +%Y-%m-%dT%H:%MZ); $N_SIMS sims (block 16, \
kv-blocks $KV_BLOCKS, ttft-base ${TTFT_BASE_MS} ms, prefill ${PREFILL_US} us/token, decode ${DECODE_MS} ms/token, \
max $MAX_TOKENS output tokens); workload seed $SEED, $CONVERSATIONS conversations x $TURNS turns, closed loop \
concurrency $CONCURRENCY; overhead: sequential requests on one zero-time sim, per shape $OVER_COUNTS; \
throughput: $THRU_REPS runs per shape of $THRU_COUNTS requests, closed loop concurrency $THRU_CONCURRENCY, \
$THRU_SIMS zero-time sims; replicas: $REPL_ROUNDS round(s), $REPL_CONVERSATIONS conversations x $REPL_TURNS turns, \
closed loop concurrency $REPL_CONCURRENCY; disagg: $DIS_ROUNDS round(s), ${DIS_ROLE_LIST[*]}, shared images \
$DIS_REQUESTS requests over $DIS_IMAGES images of ${DIS_IMAGE_PX}x${DIS_IMAGE_PX} px, closed loop concurrency \
$DIS_CONCURRENCY; sections $ONLY; script wall time ${ELAPSED} s ($(nproc) CPUs)"
# A run of some sections or shapes does not replace the full report.
OUT="$BENCH/results/latest.md"
[[ $ONLY == "$ALL_SECTIONS" && -z ${BENCH_SHAPES:-} ]] || OUT="$BENCH/results/partial.md"
OUT=${BENCH_OUT:-$OUT}
# report.py checks every figure first (bench/plausible.py); with any implausible one it writes nothing
# and exits 2, its stderr naming each figure, and the previous results file stays as it was.
if python3 "$BENCH/report.py" --rows "$ROWS" --overhead "$OVER" --throughput "$THRU" --replicas "$REPL" \
  --precise "$PREC" --affinity "$AFF" --disagg "$DIS" --params "$PARAMS" --ttft-base-ms "$TTFT_BASE_MS" --prefill-us "$PREFILL_US" \
  --aff-preprocess-us "$AFF_PREPROCESS_US" --cores "$(nproc)" --clk-tck "$CLK_TCK" >"$WORK/report.md" 2>"$WORK/report.err"; then
  cp "$WORK/report.md" "$OUT"
  cat "$OUT"
else
  cat "$WORK/report.err" >&2
  before=${#FAILURES[@]}
  while IFS= read -r line; do fail report "$line"; done < <(grep '^implausible: ' "$WORK/report.err" || true)
  ((${#FAILURES[@]} > before)) || fail report "report.py failed (see $WORK/report.err)"
  log "nothing written to $OUT"
fi
if [[ -n ${BENCH_CORRUPT:-} && ! -e $WORK/corrupted ]]; then
  fail "harness test" "BENCH_CORRUPT=$BENCH_CORRUPT corrupted nothing (no such measurement in the sections run)"
fi
log "raw results in $WORK"
if ((${#FAILURES[@]})); then
  log "${#FAILURES[@]} failure(s):"
  for f in "${FAILURES[@]}"; do log "  $f"; done
  exit 1
fi
