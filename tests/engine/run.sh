#!/usr/bin/env bash
# The real-engine suite (tests/engine/main.rs): vLLM's CPU build on tiny checkpoints of the bundled
# profiles' real files, behind the router. `prepare.sh` installs what it needs into a cache that later
# runs reuse ($MMROUTER_ENGINE_CACHE, default ~/.cache/mmrouter): the vLLM venv (~6.3 GB, 1.5-4 min to
# install) and the checkpoints (~80 MB each, ~7 s to build).
# Cost on 2 cores once installed: ~4 min (five engine starts of 45-75 s, two at a time, and the checks).
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
while IFS= read -r line; do export "${line?}"; done < <(bash tests/engine/prepare.sh)
# One test at a time: each starts two engines (~6 GB of memory each).
cargo test --locked --test engine -- --ignored --test-threads=1 --nocapture
echo "engine suite: done in $(( $(date +%s) - start )) s"
