# shellcheck shell=bash
# The `precise` section of bench/run.sh (sourced by it; uses its helpers: start_sims, start_router,
# stop_router, stop_sims, counter_sum, fail, log, the routing workload and loadgen).
#
# Precise mode against approximate mode (issue 25 item 0: knowing the caches must never route worse
# than guessing them): the same router (kv, exact accounting), the routing section's workload and
# timing model, at the routing section's concurrency and at 1. Each run gets 4 fresh sims (cold
# caches); in precise mode they publish KV events and the router follows them. PREC_ROUNDS rounds,
# each running both modes at every concurrency, the mode that goes first alternating round by round,
# so the two modes are always measured seconds apart and compared round by round.
# PREC_CONCURRENCIES overrides the concurrencies (e.g. "16"); PREC_PRECISE_TOML adds [routing] lines to
# the precise-mode router only (an ablation: BENCH_ROUTING_TOML reaches both); PREC_SIM_EVENTS=both has
# the sims publish KV events in approximate mode too (unread: the CPU the events cost, as a control).
# Output: rows appended to $PREC (run.sh's $WORK/precise.tsv, read by report.py --precise).

# prec_run CONC MODE ROUND: one run on fresh sims; appends: concurrency, mode, round, status, loadgen json,
# Σ sims' cached tokens, Σ sims' prompt tokens, prompt tokens per sim. Each request's route, worker and
# usage go to $WORK/<run>.requests.jsonl (where the two modes differ, request by request).
prec_run() {
  local conc=$1 mode=$2 round=$3 ev= kind=mmrouter:kv:true name status=ok
  [[ $mode == precise ]] && { ev=events; kind+=":events"; }
  # A control: the sims publish events in both modes (the approximate router does not subscribe), so
  # both pay the publishing's CPU on this shared host.
  [[ ${PREC_SIM_EVENTS:-} == both ]] && ev=events
  name="precise-c$conc-$mode-$round"
  log "precise round $round, concurrency $conc: $mode"
  start_sims "$N_SIMS" "$TTFT_BASE_MS" "$PREFILL_US" "$DECODE_MS" "$KV_BLOCKS" "$ev"
  [[ $mode == precise ]] && ROUTER_ROUTING_TOML=${PREC_PRECISE_TOML:-}
  if ! start_router "$kind" "$name"; then
    ROUTER_ROUTING_TOML=
    printf '%s\t%s\t%s\tn/a (%s)\t\t\t\t\n' "$conc" "$mode" "$round" "$ROUTER_ERR" >>"$PREC"
    fail "precise $name" "$ROUTER_ERR"
    stop_sims
    return 0
  fi
  ROUTER_ROUTING_TOML=
  "$LOADGEN" loadgen --url "$ROUTER_URL" --workload "$WORK/workload.jsonl" --concurrency "$conc" \
    --timeout-secs 120 --label "$name" --json-out "$WORK/$name.json" \
    --requests-out "$WORK/$name.requests.jsonl" >&2 || {
    status="n/a (loadgen failed)"
    fail "precise $name" "loadgen failed (see the log above)"
  }
  # The cached ratio from the sims' own counters too (vLLM counts every prompt token as queried).
  sims_counters
  # The router's own series after the run (index entries by source, KV-event counters), for diagnosis.
  curl -sf --max-time 5 "$ROUTER_METRICS" >"$WORK/$name.prom" || : >"$WORK/$name.prom"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$conc" "$mode" "$round" "$status" "$WORK/$name.json" "$SIMS_HITS" \
    "$SIMS_PROMPT" "$SIMS_SPLIT" >>"$PREC"
  stop_router
  stop_sims
}

precise_section() {
  local round conc modes mode
  local concs=${PREC_CONCURRENCIES:-"$CONCURRENCY 1"}
  log "precise: $PREC_ROUNDS round(s), approximate and precise in turns, concurrency $concs"
  for round in $(seq 1 "$PREC_ROUNDS"); do
    modes="approximate precise"
    ((round % 2 == 0)) && modes="precise approximate"
    for conc in $concs; do
      for mode in $modes; do prec_run "$conc" "$mode" "$round"; done
    done
  done
}
