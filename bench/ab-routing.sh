#!/usr/bin/env bash
# A/B of two [routing] variants of one mmrouter build, in turns, on the routing workload and timing
# model of bench/run.sh (4 sims, prefill contention): what the precise section cannot show, since it
# compares modes, not settings.
#
#   AB_A='...' AB_B='queue_weight = 0.15' bench/ab-routing.sh
#
# AB_A / AB_B: [routing] lines of each variant (newline-separated; empty = the defaults). AB_MODES:
# "approximate precise" (default; precise = the sims publish KV events and the router follows them).
# AB_ROUNDS (5), AB_CONVERSATIONS (96), AB_TURNS (4), AB_CONCURRENCY (16): the full run's sizes.
# MMROUTER_BIN: the build (default target/release/mmrouter, built beforehand). Every round runs every
# (mode, variant) pair on fresh sims, in an order rotated each round. Prints one line per run, then per
# mode the medians, the median over rounds of B / A, and the follow-up turns each variant moved to another
# worker than their conversation's previous turn. Raw results stay in the printed directory.
# Everything binds 127.0.0.1 and the images are generated: nothing leaves the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
MMR=${MMROUTER_BIN:-target/release/mmrouter}
ROUNDS=${AB_ROUNDS:-5} CONV=${AB_CONVERSATIONS:-96} TURNS=${AB_TURNS:-4} CONC=${AB_CONCURRENCY:-16}
read -r -a MODES <<<"${AB_MODES:-approximate precise}"
W=$(mktemp -d /tmp/mmrouter-ab.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
[[ -x $MMR ]] || { echo "ab-routing: $MMR is not built (cargo build --release)" >&2; exit 1; }

AB_NAME=ab-routing
source bench/ab-common.sh

# run NAME MODE ROUTING: fresh sims and router, the workload through it, a JSON report in $W/NAME.json.
run() {
  local name=$1 mode=$2 routing=$3 cfg="$W/$1.toml" rp i port ep
  local ev=()
  PIDS=()
  rp=$(free_port)
  printf '[server]\nlisten = "127.0.0.1:%s"\n\n[model]\ndir = "qwen3-vl"\nblock_size = 16\nexact_accounting = true\n\n' \
    "$rp" >"$cfg"
  for i in 0 1 2 3; do
    port=$(free_port) ev=()
    [[ $mode == precise ]] && { ep="tcp://127.0.0.1:$(free_port)"; ev=(--kv-events "$ep"); }
    "$MMR" sim --host 127.0.0.1 --port "$port" --name "sim$i" --block-size 16 --kv-blocks 6144 --ttft-base-ms 5 \
      --prefill-us-per-token 20 --decode-ms-per-token 1 --max-output-tokens 32 --seed $((7 + i)) \
      "${ev[@]+"${ev[@]}"}" >"$W/$name-sim$i.log" 2>&1 &
    PIDS+=($!)
    printf '[[workers]]\nname = "sim%s"\nurl = "http://127.0.0.1:%s"\n' "$i" "$port" >>"$cfg"
    [[ $mode == precise ]] && printf 'kv_events = "%s"\n' "$ep" >>"$cfg"
    printf '\n' >>"$cfg"
    wait_http "http://127.0.0.1:$port/health"
  done
  # The workload's 24–34 MP photos fall back (the sims serve them), as in bench/run.sh.
  printf '[routing]\npolicy = "kv"\n%s\n\n[media]\nallow_cidrs = ["127.0.0.0/8"]\nmax_pixels = 16000000\n' \
    "$routing" >>"$cfg"
  "$MMR" serve --config "$cfg" >"$W/$name.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$rp/health"
  "$MMR" loadgen --url "http://127.0.0.1:$rp" --workload "$W/workload.jsonl" --concurrency "$CONC" \
    --timeout-secs 120 --label "$name" --json-out "$W/$name.json" --requests-out "$W/$name.requests.jsonl" >/dev/null
  kill "${PIDS[@]}" 2>/dev/null || true
  wait "${PIDS[@]}" 2>/dev/null || true
  python3 - "$W/$name.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{d['label']}: ok {d['ok']}/{d['requests']}, p50 {d['latency_ms']['p50']:.1f} ms, "
      f"p99 {d['latency_ms']['p99']:.1f} ms, cached {100 * d['cached_ratio']:.1f} %, {d['duration_secs']:.2f} s")
PY
}

# The same workload as bench/run.sh's: its fixture photos when present.
WL=(--seed 7 --conversations "$CONV" --turns "$TURNS" --max-tokens 32)
[[ -d tests/fixtures/images ]] && WL+=(--images-dir tests/fixtures/images)
"$MMR" workload "${WL[@]}" --out "$W/workload.jsonl" 2>/dev/null
pairs=()
for mode in "${MODES[@]}"; do pairs+=("$mode A" "$mode B"); done
for r in $(seq "$ROUNDS"); do
  for k in "${!pairs[@]}"; do
    read -r mode variant <<<"${pairs[$(((k + r) % ${#pairs[@]}))]}"
    routing=${AB_A:-}
    [[ $variant == B ]] && routing=${AB_B:-}
    run "$mode-$variant-$r" "$mode" "${routing:-}"
  done
done

python3 - "$W" "$ROUNDS" "${MODES[@]}" <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench")
from report import turns_moved  # follow-up turns sent to another worker than their previous turn
w, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
figures = {"p50 ms": lambda d: d["latency_ms"]["p50"], "p99 ms": lambda d: d["latency_ms"]["p99"],
           "cached": lambda d: d["cached_ratio"], "completion s": lambda d: d["duration_secs"]}
for mode in modes:
    runs = {v: [json.load(open(f"{w}/{mode}-{v}-{r}.json")) for r in range(1, rounds + 1)] for v in "AB"}
    parts = []
    for name, f in figures.items():
        a, b = [statistics.median(f(d) for d in runs[v]) for v in "AB"]
        ratio = statistics.median(f(y) / f(x) for x, y in zip(runs["A"], runs["B"]) if f(x))
        parts.append(f"{name} A {a:.4g} B {b:.4g} (B/A {ratio:.3f})")
    moved = {v: [turns_moved(f"{w}/{mode}-{v}-{r}.json") for r in range(1, rounds + 1)] for v in "AB"}
    parts.append("turns moved " + ", ".join(
        f"{v} {statistics.median(m for m, _ in moved[v]):g} of {moved[v][0][1]}" for v in "AB"))
    print(f"{mode}, {rounds} round(s): " + "; ".join(parts))
print(f"raw results in {w}")
PY
