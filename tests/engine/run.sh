#!/usr/bin/env bash
# The real-engine suite (tests/engine/main.rs): vLLM's CPU build on tiny checkpoints of the bundled
# profiles' real files, behind the router. `prepare.sh` installs what it needs into a cache that later
# runs reuse ($MMROUTER_ENGINE_CACHE, default ~/.cache/mmrouter): the vLLM venv (~6.3 GB, 1.5-4 min to
# install), NIXL for the P/D engines (~470 MB, ~6 s) and the checkpoints (~80 MB each, ~7 s to build).
# Cost on 2 cores once installed: ~8 min (engine starts of 45-80 s, two at a time, and the checks; the
# video tests (video.rs) take 95-147 s for their two engines, and 65-80 s more for the fps-4 one
# (measured: 63-76 s to start it, ~4 s of checks; both video tests 162 s),
# plus disaggregated serving (disagg.rs): two P/D engines, then three E/PD engines, each set started
# together and checked in 5-30 s. Measured: 748 s for both on a machine busy with other builds (the
# engine sets up in 253 and 466 s; the whole suite 1349 s there); an idle machine starts engines 2-4x
# faster (one alone in ~70 s), so ~5 min is the estimate for CI. LoRA (lora.rs: two engines, one serving
# a random adapter) and the Responses API (responses.rs: two engines storing responses): ~20-30 s of
# checks each after their engines' start (161-231 s on a machine busy with builds); both 413 s in one run.
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
while IFS= read -r line; do export "${line?}"; done < <(bash tests/engine/prepare.sh)
# One test at a time: each starts two engines (~6 GB of memory each), the E/PD one three (two encoders
# of ~4.8 GB and a ~6 GB engine: ~16 GB).
cargo test --locked --test engine -- --ignored --test-threads=1 --nocapture
echo "engine suite: done in $(( $(date +%s) - start )) s"
