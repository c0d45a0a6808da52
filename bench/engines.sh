#!/usr/bin/env bash
# Routing on real engines: the multimodal multi-turn workload against two vLLM CPU workers (the
# real-engine suite's tiny Qwen2.5-VL checkpoint, KV events on), through
#   mmrouter kv precise (events via discovery), mmrouter kv approximate (no events),
#   sglang-router cache_aware, and mmrouter round_robin,
# the paths taking turns round by round, each run on emptied caches (vLLM's dev-mode
# /reset_prefix_cache and /reset_mm_cache). Cached ratio, TTFB and latency come from the engines' own
# answers (usage.prompt_tokens_details.cached_tokens, the streamed first byte). Small on purpose: it is
# the independent check of the simulator's routing figures, not a load test.
#
# Usage: bench/engines.sh [--no-build]   (env: ENGINE_BENCH_ROUNDS=3, ENGINE_BENCH_CONVERSATIONS=16,
#   ENGINE_BENCH_TURNS=3, ENGINE_BENCH_CONCURRENCY=4, MMROUTER_BIN, SGLANG_ROUTER_VERSION=0.3.2)
# Output: bench/results/engines.md (also printed). Everything listens on 127.0.0.1; after the installs
# the script re-runs itself in a network namespace with loopback only (`unshare -rn`).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MMR=${MMROUTER_BIN:-$ROOT/target/release/mmrouter}
ROUNDS=${ENGINE_BENCH_ROUNDS:-3}
CONVS=${ENGINE_BENCH_CONVERSATIONS:-16}
TURNS=${ENGINE_BENCH_TURNS:-3}
CONC=${ENGINE_BENCH_CONCURRENCY:-4}
SGL_VERSION=${SGLANG_ROUTER_VERSION:-0.3.2}
SGL_VENV=$ROOT/bench/.venv/sgl
log() { printf '[engines %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ ${1:-} != --phase=run ]]; then
  [[ ${1:-} == --no-build ]] || cargo build --release --locked
  while IFS= read -r line; do export "${line?}"; done < <(bash tests/engine/prepare.sh)
  if [[ $("$SGL_VENV/bin/python" -m pip show sglang-router 2>/dev/null | sed -n 's/^Version: //p') != "$SGL_VERSION" ]]; then
    log "installing sglang-router $SGL_VERSION"
    python3 -m venv "$SGL_VENV" && "$SGL_VENV/bin/pip" install -q "sglang-router==$SGL_VERSION"
  fi
  export MMROUTER_BIN=$MMR
  exec unshare -rn bash -c 'ip link set lo up 2>/dev/null || true; exec bash "$0" --phase=run' "$0"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mmrouter-engines.XXXXXX")
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # URL SECONDS
  for _ in $(seq $(( $2 * 2 ))); do curl -sf -o /dev/null "$1" && return 0; sleep 0.5; done
  return 1
}
export VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 \
  VLLM_HOST_IP=127.0.0.1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  VLLM_SERVER_DEV_MODE=1 RUST_LOG=warn

ENGINES=()
for name in a b; do
  port=$(free_port) ev=$(free_port) rp=$(free_port)
  setsid "$MMROUTER_VLLM_PYTHON" tests/engine/vllm_cli.py serve "$MMROUTER_ENGINE_CHECKPOINTS/qwen2.5-vl" \
    --served-model-name qwen2.5-vl --host 127.0.0.1 --port "$port" --max-model-len 8192 --block-size 32 \
    --dtype float32 --enable-prefix-caching --enable-prompt-tokens-details --enforce-eager --max-num-seqs 8 \
    --limit-mm-per-prompt '{"image":8,"video":0}' --mm-processor-kwargs '{"max_pixels": 1003520}' \
    --kv-events-config "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://[::ffff:127.0.0.1]:$ev\",\"replay_endpoint\":\"tcp://[::ffff:127.0.0.1]:$rp\"}" \
    >"$WORK/engine-$name.log" 2>&1 &
  PIDS+=($!)
  ENGINES+=("http://127.0.0.1:$port")
done
for url in "${ENGINES[@]}"; do
  wait_http "$url/health" 600 || { log "engine $url did not start"; tail -20 "$WORK"/engine-*.log; exit 1; }
done
log "engines ready: ${ENGINES[*]}"

"$MMR" workload --seed 11 --conversations "$CONVS" --turns "$TURNS" --images-dir tests/fixtures/images \
  --fallback-fraction 0 --max-images 2 --model qwen2.5-vl --max-tokens 8 --out "$WORK/workload.jsonl" >&2

router_config() { # FILE PORT POLICY EVENTS(yes|no)
  {
    printf '[server]\nlisten = "127.0.0.1:%s"\nhealth_interval_ms = 1000\naccess_log = false\n' "$2"
    # The workers' --mm-processor-kwargs, mirrored (the workload's large photos would exceed the context).
    printf '[model]\ndir = "qwen2.5-vl"\nblock_size = 32\nprocessor_kwargs = { max_pixels = 1003520 }\n' 
    printf '[routing]\npolicy = "%s"\n' "$3"
    local i=0
    for url in "${ENGINES[@]}"; do
      printf '[[workers]]\nname = "w%s"\nurl = "%s"\nengine = "vllm"\n' "$i" "$url"
      [[ $4 == yes ]] && printf 'kv_events = "discover"\n'
      i=$((i + 1))
    done
  } >"$1"
}

start_path() { # NAME -> ROUTER_URL, ROUTER_PID
  local port; port=$(free_port)
  case $1 in
    precise) router_config "$WORK/$1.toml" "$port" kv yes ;;
    approximate) router_config "$WORK/$1.toml" "$port" kv no ;;
    round_robin) router_config "$WORK/$1.toml" "$port" round_robin no ;;
  esac
  if [[ $1 == sglang ]]; then
    setsid "$SGL_VENV/bin/python" -m sglang_router.launch_router --host 127.0.0.1 --port "$port" \
      --worker-urls "${ENGINES[@]}" --policy cache_aware --log-level warn >"$WORK/$1.log" 2>&1 &
  else
    setsid "$MMR" serve --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 &
  fi
  ROUTER_PID=$!
  ROUTER_URL="http://127.0.0.1:$port"
  wait_http "$ROUTER_URL/health" 60 || { log "$1 did not start: $(tail -3 "$WORK/$1.log")"; return 1; }
  # Ready when a chat goes through (a router may answer /health before it knows its workers healthy);
  # the chat is shorter than a KV block, so it leaves nothing cached.
  for _ in $(seq 60); do
    curl -sf -o /dev/null "$ROUTER_URL/v1/chat/completions" -H 'content-type: application/json' \
      -d '{"model":"qwen2.5-vl","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' && break
    sleep 0.5
  done
  [[ $1 == precise ]] && sleep 2 # the feeds subscribe (discovery, then the ZMQ connection)
  return 0
}

reset_engines() {
  for url in "${ENGINES[@]}"; do
    for _ in 1 2 3 4 5; do
      [[ $(curl -sf -X POST "$url/reset_prefix_cache") == *true* ]] && break
      sleep 1
    done
    curl -sf -X POST "$url/reset_mm_cache" >/dev/null
  done
}

PATHS=(precise approximate sglang round_robin)
for round in $(seq "$ROUNDS"); do
  n=${#PATHS[@]}
  for k in $(seq 0 $((n - 1))); do
    path=${PATHS[$(( (k + round - 1) % n ))]}
    reset_engines
    sleep 1
    start_path "$path" || continue
    log "round $round: $path"
    "$MMR" loadgen --url "$ROUTER_URL" --workload "$WORK/workload.jsonl" --concurrency "$CONC" \
      --label "$path" --json-out "$WORK/$path-$round.json" >"$WORK/$path-$round.txt" 2>&1 \
      || log "loadgen failed on $path: $(tail -2 "$WORK/$path-$round.txt")"
    # mmrouter's own record of engine-reported minus predicted prompt tokens, per request.
    [[ $path != sglang ]] && curl -sf "$ROUTER_URL/metrics" >"$WORK/$path-$round.metrics" || true
    kill -TERM -- "-$ROUTER_PID" 2>/dev/null || true
    wait "$ROUTER_PID" 2>/dev/null || true
  done
done

python3 - "$WORK" "$ROUNDS" "$CONVS" "$TURNS" "$CONC" >"$ROOT/bench/results/engines.md" <<'PY'
import json, statistics, sys, glob, os, datetime
work, rounds, convs, turns, conc = sys.argv[1:]
paths = ["precise", "approximate", "sglang", "round_robin"]
title = {"precise": "mmrouter kv, precise (KV events)", "approximate": "mmrouter kv, approximate",
         "sglang": "sglang-router cache_aware", "round_robin": "mmrouter round_robin"}
print(f"# Routing on real vLLM engines ({datetime.datetime.utcnow():%Y-%m-%d %H:%MZ})\n")
print(f"Two vLLM 0.32.0 CPU workers (tiny random-weight Qwen2.5-VL, block 32), {convs} conversations x {turns} turns,"
      f" concurrency {conc}, {rounds} rounds with the paths in turns, caches emptied before every run."
      " Figures: median over rounds (each round's value in brackets).\n")
print("| path | requests ok | usage = prediction | cached ratio | TTFB p50 ms | TTFB p99 ms | latency p50 ms | latency p99 ms | wall s |")
print("|---|---|---|---|---|---|---|---|---|")
def exact_predictions(path):
    # Requests whose engine-reported prompt tokens equal the router's prediction: the drift
    # histogram's (-0.5, 0.5] bucket, over every request with a prediction.
    try:
        text = open(path).read()
    except OSError:
        return "n/a"
    series = {}
    for line in text.splitlines():
        if line.startswith("mmrouter_prompt_tokens_drift"):
            name, value = line.rsplit(" ", 1)
            series[name] = float(value)
    below = series.get('mmrouter_prompt_tokens_drift_bucket{le="-0.5"}', 0)
    upto = series.get('mmrouter_prompt_tokens_drift_bucket{le="0.5"}', 0)
    count = series.get("mmrouter_prompt_tokens_drift_count", 0)
    return f"{upto - below:.0f}/{count:.0f}"
for p in paths:
    runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(work, f"{p}-*.json")))]
    if not runs:
        print(f"| {title[p]} | n/a | | | | | | | |"); continue
    def col(f, fmt="{:.0f}"):
        vals = [f(r) for r in runs]
        vals = [v for v in vals if v is not None]
        if not vals: return "n/a"
        return fmt.format(statistics.median(vals)) + " (" + ", ".join(fmt.format(v) for v in vals) + ")"
    ok = ", ".join(f"{r['ok']}/{r['requests']}" for r in runs)
    exact = ", ".join(exact_predictions(f) for f in sorted(glob.glob(os.path.join(work, f"{p}-*.metrics")))) or "n/a"
    print(f"| {title[p]} | {ok} | {exact} | {col(lambda r: r['cached_ratio'], '{:.3f}')} | {col(lambda r: r['ttfb_ms']['p50'])} |"
          f" {col(lambda r: r['ttfb_ms']['p99'])} | {col(lambda r: r['latency_ms']['p50'])} | {col(lambda r: r['latency_ms']['p99'])} |"
          f" {col(lambda r: r['duration_secs'], '{:.1f}')} |")
PY
cat "$ROOT/bench/results/engines.md"
