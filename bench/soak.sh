#!/usr/bin/env bash
# Soak: a few minutes of mixed load through mmrouter, sampling its resident memory (RSS) and the
# latency of /health over time.
#
# Load: the seeded multimodal multi-turn workload (images, history resent) interleaved with one-shot
# prompts of ~500, ~2 000 and ~8 000 tokens, every one different, and a few ~1 MB prompts (planned
# on the blocking pool), closed loop against two zero-time `mmrouter sim` workers. Everything listens
# on 127.0.0.1; nothing is fetched from outside the machine (images are data URLs).
#
# Usage: bench/soak.sh [--no-build] [--minutes N]   (default 3 minutes)
# Output: bench/results/soak.md (also printed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=1
MINUTES=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --minutes) MINUTES=$2; shift ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
MMR=${MMROUTER_BIN:-$ROOT/target/release/mmrouter}
WORK=$(mktemp -d /tmp/mmrouter-soak.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
log() { printf '[soak %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() {
  local i
  for i in $(seq 1 300); do curl -sf -o /dev/null --max-time 1 "$1" && return 0; sleep 0.1; done
  echo "$1 did not answer" >&2
  exit 1
}
rss_mb() { awk '/^VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }

if [[ $BUILD == 1 ]]; then log "cargo build --release"; (cd "$ROOT" && cargo build --release --locked -q); fi

log "workload"
"$MMR" workload --seed 11 --conversations 400 --turns 4 --max-tokens 8 --no-stream \
  --out "$WORK/conversations.jsonl" >/dev/null
python3 - "$WORK" <<'EOF'
import json, random, sys
work = sys.argv[1]
rng = random.Random(11)
lines = open(f"{work}/conversations.jsonl").read().splitlines()
words = ["alpha", "river", "ledger", "quartz", "violet", "harbor", "signal", "meadow", "cobalt", "orbit"]
def prompt(n_words, i):
    return " ".join(f"{rng.choice(words)}{i}_{k}" for k in range(n_words))
one_shot = []
for i in range(3000):
    n = rng.choice([170, 700, 2800])  # ~500, ~2000, ~8000 tokens: every prompt new
    body = {"model": "qwen3-vl", "max_tokens": 8, "messages": [{"role": "user", "content": prompt(n, i)}]}
    one_shot.append(json.dumps({"path": "/v1/chat/completions", "conversation": f"one-shot-{len(one_shot)}", "body": body}))
for i in range(30):  # ~1 MB each
    body = {"model": "qwen3-vl", "max_tokens": 8, "messages": [{"role": "user", "content": prompt(90000, 10_000 + i)}]}
    one_shot.append(json.dumps({"path": "/v1/chat/completions", "conversation": f"one-shot-{len(one_shot)}", "body": body}))
mixed = lines + one_shot
rng.shuffle(mixed)
open(f"{work}/mixed.jsonl", "w").write("\n".join(mixed * 4) + "\n")
EOF

SIMS=()
for i in 0 1; do
  port=$(free_port)
  "$MMR" sim --host 127.0.0.1 --port "$port" --name "sim$i" --block-size 16 --ttft-base-ms 0 \
    --prefill-us-per-token 0 --decode-ms-per-token 0 --max-output-tokens 8 >"$WORK/sim$i.log" 2>&1 &
  PIDS+=($!)
  SIMS+=("http://127.0.0.1:$port")
done
port=$(free_port)
{
  printf '[server]\nlisten = "127.0.0.1:%s"\n\n[model]\ndir = "qwen3-vl"\n\n' "$port"
  for i in "${!SIMS[@]}"; do printf '[[workers]]\nname = "sim%s"\nurl = "%s"\n\n' "$i" "${SIMS[$i]}"; done
} >"$WORK/router.toml"
for s in "${SIMS[@]}"; do wait_http "$s/health"; done
"$MMR" serve --config "$WORK/router.toml" >"$WORK/router.log" 2>&1 &
ROUTER=$!
PIDS+=("$ROUTER")
URL="http://127.0.0.1:$port"
wait_http "$URL/health"

log "soak: $MINUTES min, concurrency 8"
START_RSS=$(rss_mb "$ROUTER")
"$MMR" loadgen --url "$URL" --workload "$WORK/mixed.jsonl" --concurrency 8 --duration-secs $((MINUTES * 60)) \
  --timeout-secs 120 --label soak --json-out "$WORK/soak.json" >"$WORK/loadgen.txt" 2>&1 &
LOAD=$!
PIDS+=("$LOAD")
SAMPLES="$WORK/samples.tsv"
t0=$(date +%s)
while kill -0 "$LOAD" 2>/dev/null; do
  health_ms=$(curl -s -o /dev/null -w '%{time_total}' --max-time 10 "$URL/health" | awk '{printf "%.1f", $1 * 1000}')
  printf '%s\t%s\t%s\n' "$(($(date +%s) - t0))" "$(rss_mb "$ROUTER")" "$health_ms" >>"$SAMPLES"
  sleep 10
done
wait "$LOAD" || true
sleep 10
AFTER_RSS=$(rss_mb "$ROUTER")

OUT="$ROOT/bench/results/soak.md"
{
  echo "# Soak ($(date -u +%Y-%m-%dT%H:%MZ), $MINUTES min, $(nproc) CPUs, commit $(git -C "$ROOT" rev-parse --short HEAD))"
  echo
  echo "Mixed load, closed loop concurrency 8, two zero-time sims: multimodal conversations, unique one-shot"
  echo "prompts of ~500/2000/8000 tokens, 1 % prompts of ~1 MB. RSS of the mmrouter process."
  echo
  grep -E '^\| (run|---|soak)' "$WORK/loadgen.txt" || tail -n 5 "$WORK/loadgen.txt"
  echo
  echo "| t (s) | RSS (MB) | /health (ms) |"
  echo "|---|---|---|"
  echo "| start (idle) | $START_RSS | |"
  awk -F'\t' '{printf "| %s | %s | %s |\n", $1, $2, $3}' "$SAMPLES"
  echo "| 10 s after the load | $AFTER_RSS | |"
} >"$OUT"
cat "$OUT"
