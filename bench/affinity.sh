# shellcheck shell=bash
# The `affinity` section of bench/run.sh (sourced by it; uses its helpers: start_sims, start_router,
# stop_router, stop_sims, counter_sum, fail, log, the routing workload and loadgen).
#
# Image affinity (issue 25): requests that share an image but not the text before it, and the routing
# section's multimodal workload, through
#   aff      mmrouter kv, exact, image credit on (its weights set to the sims' image costs)
#   noaff    the same router with the image credit off (image_*_weight = 0)
#   sgl      sglang-router cache_aware (run.sh's arguments); n/a with --no-peers
#   rr       direct round-robin (the load generator spreads requests over the sims itself)
# each on 4 fresh sims that publish KV events (precise mode) and model vLLM's processor and encoder
# caches with per-image preprocess and encode time (aff_sim_args). AFF_ROUNDS rounds, each running
# every row on both workloads, in an order rotated each round; ratios are per round against `noaff`.
# AFF_ROWS_ONLY (e.g. "aff,noaff") keeps those rows, AFF_WL_ONLY (shared or multimodal) that workload.
# Output: rows appended to $AFF (run.sh's $WORK/affinity.tsv, read by report.py --affinity).

AFF_ROWS=(
  "aff|mmrouter kv, image affinity"
  "noaff|mmrouter kv, no image affinity"
  "sgl|sglang-router cache_aware"
  "rr|direct round-robin (no router)"
)
# The sims' image caches, sized with the workload so that its images outgrow one worker's caches but
# fit in the pool's: AFF_PROC_GB of processed pixels (1 GiB: about 57 000 encoder tokens) and
# AFF_ENC_TOKENS encoder tokens per worker, against AFF_IMAGES camera photos of 1–12 MP (about
# 1 000–12 000 tokens each, some 120 000 in all); the router models the same caches, its weights the
# sims' image costs (AFF_PREPROCESS_US, default 20, and 10 µs per token) against their prefill (20 µs).
# The default is what bench/preprocess-cost.py measures on this machine's CPU for the workload's photos
# (HF Qwen-VL processor, one thread: 7–8 µs per token for sub-megapixel photos, ~19 µs for a 3 MP one;
# the shared-images photos are 1–12 MP). Before stop 39 the default was an assumed 5.
AFF_PREPROCESS_US=${AFF_PREPROCESS_US:-20}
aff_sim_args() {
  SIM_EXTRA_ARGS=(--mm-processor-cache-gb "$AFF_PROC_GB" --encoder-cache-tokens "$AFF_ENC_TOKENS"
    --image-preprocess-us-per-token "$AFF_PREPROCESS_US" --image-encode-us-per-token 10)
}
# aff_routing ROW: its [routing] lines (no credit for noaff).
aff_routing() {
  local pre enc=0.5
  pre=$(awk -v p="$AFF_PREPROCESS_US" -v f="$PREFILL_US" 'BEGIN { printf "%g", p / f }')
  [[ $1 == noaff ]] && pre=0 enc=0
  printf 'processor_cache_gb = %s\nencoder_cache_tokens = %s\nimage_preprocess_weight = %s\nimage_encoder_weight = %s' \
    "$AFF_PROC_GB" "$AFF_ENC_TOKENS" "$pre" "$enc"
}

# aff_run WORKLOAD ROUND ROW: one run on fresh sims; appends: workload, row, title, round, status,
# loadgen json, Σ sims' cached tokens, Σ sims' prompt tokens, prompt tokens per sim, Σ sims'
# processor-cache queries, Σ hits, Σ encoder-cache queries, Σ hits.
aff_run() {
  local wl=$1 round=$2 row=$3 title=$4 kind name status=ok u urls=()
  case $row in
    aff | noaff) kind=mmrouter:kv:true:events ;;
    sgl) kind=sgl ;;
    rr) kind=direct ;;
  esac
  name="affinity-$wl-$row-$round"
  log "affinity round $round, $wl: $title"
  aff_sim_args
  start_sims "$N_SIMS" "$TTFT_BASE_MS" "$PREFILL_US" "$DECODE_MS" "$KV_BLOCKS" events
  SIM_EXTRA_ARGS=()
  ROUTER_ROUTING_TOML=$(aff_routing "$row")
  if ! start_router "$kind" "$name"; then
    ROUTER_ROUTING_TOML=
    printf '%s\t%s\t%s\t%s\tn/a (%s)\t\t\t\t\t\t\t\t\t\n' "$wl" "$row" "$title" "$round" "$ROUTER_ERR" >>"$AFF"
    unavailable_is_failure "$kind" && fail "affinity $name" "$ROUTER_ERR"
    stop_sims
    return 0
  fi
  ROUTER_ROUTING_TOML=
  if [[ $kind == direct ]]; then
    for u in "${SIM_URLS[@]}"; do urls+=(--url "$u"); done
  else
    urls=(--url "$ROUTER_URL")
  fi
  "$LOADGEN" loadgen "${urls[@]}" --workload "$WORK/affinity-$wl.jsonl" --concurrency "$AFF_CONCURRENCY" \
    --timeout-secs 120 --label "$name" --json-out "$WORK/$name.json" >&2 || {
    status="n/a (loadgen failed)"
    fail "affinity $name" "loadgen failed (see the log above)"
  }
  sims_counters "$name"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$wl" "$row" "$title" "$round" "$status" \
    "$WORK/$name.json" "$SIMS_HITS" "$SIMS_PROMPT" "$SIMS_SPLIT" "$SIMS_MM_Q" "$SIMS_MM_H" "$SIMS_ENC_Q" \
    "$SIMS_ENC_H" >>"$AFF"
  stop_router
  stop_sims
}

# affinity_workloads: the shared-images workload (the multimodal one is the routing section's).
affinity_workloads() {
  local args=(--seed "$SEED" --shape shared-images --images "$AFF_IMAGES" --conversations "$AFF_REQUESTS"
    --max-tokens "$MAX_TOKENS")
  "$LOADGEN" workload "${args[@]}" --out "$WORK/affinity-shared.jsonl" >&2
  cp "$WORK/workload.jsonl" "$WORK/affinity-multimodal.jsonl"
}

affinity_section() {
  local round wl k i nrows=${#AFF_ROWS[@]} row title
  affinity_workloads
  log "affinity: $AFF_ROUNDS round(s) of ${nrows} rows x 2 workloads, shared-images $AFF_REQUESTS requests over $AFF_IMAGES images, concurrency $AFF_CONCURRENCY"
  for round in $(seq 1 "$AFF_ROUNDS"); do
    for wl in shared multimodal; do
      for k in $(seq 0 $((nrows - 1))); do
        i=$(((k + round - 1) % nrows))
        IFS='|' read -r row title <<<"${AFF_ROWS[$i]}"
        [[ -z ${AFF_ROWS_ONLY:-} || ",$AFF_ROWS_ONLY," == *",$row,"* ]] || continue
        [[ -z ${AFF_WL_ONLY:-} || $AFF_WL_ONLY == "$wl" ]] || continue
        aff_run "$wl" "$round" "$row" "$title"
      done
    done
  done
}
