# shellcheck shell=bash
# The `replicas` section of bench/run.sh (sourced by it; uses its helpers: start_sims, start_router,
# free_port, wait_http, stop_pids, counter_sum, fail, unavailable_is_failure, the workload and loadgen).
#
# Several router replicas behind one address that spreads requests round-robin, as a Kubernetes Service
# without session affinity does (the load generator round-robins per request over its --url values).
# Rows, each on 4 fresh sims (cold caches, the routing section's timing model and prefill contention),
# in two modes: "precise" (the sims publish KV events, the workers are configured with kv_events) and
# "approximate" (no events):
#   one      1 router: one mmrouter, policy kv, exact accounting (the baseline)
#   lone     3 lone replicas: three mmrouter processes with the same config, each its own port
#   cluster  3 replicas + [cluster]: the same three sharing in-flight state over a real nats-server
#            (started on 127.0.0.1 for the row, stopped after it)
#   sgl      3 sglang-router replicas (cache_aware, run.sh's sgl arguments); n/a with --no-peers
#   shadow   a control, only when REPL_ROWS_ONLY names it: 3 lone replicas, every request to the first
#            (1 router's routing, 3 routers' event ingestion on the same cores)
# REPL_ROUNDS rounds: every row of both modes once per round, in an order rotated each round, so rows
# measured seconds apart are compared; each ratio is the median over the rounds of that round's
# row / that round's `1 router` row of the same mode.
# Output: rows appended to $REPL (run.sh's $WORK/replicas.tsv, read by report.py --replicas), and each
# replica's /metrics after its run ($WORK/replicas-MODE-ROW-ROUND-rK.prom).

REPL_ROWS=(
  "one|1 router"
  "lone|3 lone replicas"
  "cluster|3 replicas + [cluster]"
  "sgl|3 sglang-router replicas"
  "shadow|1 router + 2 idle replicas"
)
read -r -a REPL_MODES <<<"${REPL_MODES_ONLY:-approximate precise}"
REPL_N=3 # replicas in the multi-replica rows

# Phase 1 (network allowed): nats-server from Debian's package when missing. Writes $WORK/nats.status
# ("ok" or the reason) and $WORK/nats.bin.
replicas_prepare() {
  local bin
  bin=$(command -v nats-server 2>/dev/null || true)
  [[ -n $bin || ! -x /usr/sbin/nats-server ]] || bin=/usr/sbin/nats-server
  if [[ -z $bin ]]; then
    log "installing nats-server (Debian package nats-server)"
    if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      nats-server) >"$WORK/apt-nats.log" 2>&1; then
      bin=$(command -v nats-server 2>/dev/null || echo /usr/sbin/nats-server)
    fi
  fi
  if [[ -n $bin && -x $bin ]]; then
    echo "$bin" >"$WORK/nats.bin"
    echo ok >"$WORK/nats.status"
  else
    echo "nats-server is not installed and apt-get install nats-server failed: $(tail -n 1 "$WORK/apt-nats.log" 2>/dev/null | tr '\t|' '  ' | cut -c1-100)" >"$WORK/nats.status"
    log "$(cat "$WORK/nats.status")"
  fi
}

NATS_PID= NATS_URL= NATS_ERR=
# start_nats NAME: a nats-server on 127.0.0.1 and a free port (NATS_URL), or NATS_ERR.
start_nats() {
  local name=$1 status port i
  NATS_PID= NATS_URL= NATS_ERR=
  status=$(cat "$WORK/nats.status" 2>/dev/null || echo "nats-server was not prepared")
  if [[ $status != ok ]]; then NATS_ERR=$status; return 1; fi
  port=$(free_port)
  "$(cat "$WORK/nats.bin")" -a 127.0.0.1 -p "$port" >"$WORK/$name.log" 2>&1 &
  NATS_PID=$!
  PIDS+=("$NATS_PID")
  for i in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      NATS_URL="nats://127.0.0.1:$port"
      return 0
    fi
    kill -0 "$NATS_PID" 2>/dev/null || break
    sleep 0.1
  done
  NATS_ERR="nats-server did not start: $(tail -n 1 "$WORK/$name.log" | tr '\t|' '  ' | cut -c1-120)"
  stop_pids "$NATS_PID"
  NATS_PID=
  return 1
}

# gauge_of URL NAME: the value of an unlabelled gauge (empty when absent).
gauge_of() {
  curl -sf --max-time 5 "$1" | awk -v name="$2" '$1 == name {print $NF; exit}'
}

# wait_peers N METRICS...: until every replica's mmrouter_cluster_peers is N (10 s at most); prints
# each replica's gauge, comma-separated, as last seen.
wait_peers() {
  local want=$1 i m seen all
  shift
  for i in $(seq 1 100); do
    seen=() all=1
    for m in "$@"; do
      seen+=("$(gauge_of "$m" mmrouter_cluster_peers)")
      [[ ${seen[-1]} == "$want" ]] || all=0
    done
    ((all)) && break
    sleep 0.1
  done
  (IFS=,; echo "${seen[*]}")
}

# repl_row MODE ROUND ROW TITLE: one row on fresh sims; appends to $REPL: mode, row, title, round,
# status, loadgen json, Σ sims' cached tokens, Σ sims' prompt tokens, prompt tokens per sim, the
# replicas' /metrics files (comma-separated), peers seen before the load (cluster row).
repl_row() {
  local mode=$1 round=$2 row=$3 title=$4 ev= kind=mmrouter:kv:true n=$REPL_N k name err= status=ok
  local urls=() pids=() metrics=() proms=() peers=
  [[ $mode == precise ]] && { ev=events; kind+=":events"; }
  [[ $row == one ]] && n=1
  [[ $row == sgl ]] && kind=sgl
  name="replicas-$mode-$row-$round"
  log "replicas round $round, $mode: $title"
  start_sims "$N_SIMS" "$TTFT_BASE_MS" "$PREFILL_US" "$DECODE_MS" "$KV_BLOCKS" "$ev"
  if [[ $row == cluster ]] && ! start_nats "$name-nats"; then err=$NATS_ERR; fi
  for k in $(seq 1 "$n"); do
    [[ -z $err ]] || break
    ROUTER_EXTRA_TOML=
    [[ $row == cluster ]] && ROUTER_EXTRA_TOML=$(printf '[cluster]\nreplica_id = "r%s"\nnats_url = "%s"' "$k" "$NATS_URL")
    if start_router "$kind" "$name-r$k"; then
      pids+=("$ROUTER_PID") urls+=(--url "$ROUTER_URL") metrics+=("$ROUTER_METRICS")
    else
      err="replica r$k $ROUTER_ERR"
      ((n > 1)) || err=$ROUTER_ERR
    fi
  done
  ROUTER_EXTRA_TOML=
  if [[ -n $err ]]; then
    printf '%s\t%s\t%s\t%s\tn/a (%s)\t\t\t\t\t\t\n' "$mode" "$row" "$title" "$round" "$err" >>"$REPL"
    unavailable_is_failure "$kind" && fail "replicas $name" "$err"
    log "$name: n/a ($err)"
    ((${#pids[@]} == 0)) || stop_pids "${pids[@]}"
    [[ -z $NATS_PID ]] || stop_pids "$NATS_PID"
    NATS_PID=
    stop_sims
    return 0
  fi
  # The control row routes everything through the first replica; the others only follow the feeds.
  [[ $row == shadow ]] && urls=("${urls[@]:0:2}")
  # A warm cluster: every replica has heard the others' heartbeats before the load starts.
  [[ $row == cluster ]] && peers=$(wait_peers $((n - 1)) "${metrics[@]}")
  "$LOADGEN" loadgen "${urls[@]}" --workload "$WORK/replicas-workload.jsonl" --concurrency "$REPL_CONCURRENCY" \
    --timeout-secs 120 --label "$name" --json-out "$WORK/$name.json" >&2 || {
    status="n/a (loadgen failed)"
    fail "replicas $name" "loadgen failed (see the log above)"
  }
  # The cached ratio from the sims' own counters (vLLM counts every prompt token as queried).
  sims_counters
  for k in "${!metrics[@]}"; do
    proms+=("$WORK/$name-r$((k + 1)).prom")
    curl -sf --max-time 5 "${metrics[$k]}" >"${proms[-1]}" || : >"${proms[-1]}"
  done
  if [[ $row == cluster ]]; then
    # Once every request has ended, no replica should hold another's booking: the gauge is refreshed
    # on each heartbeat (1 s), so read it again after two of them (`<name>-rK.settled.prom`).
    sleep 2.5
    for k in "${!metrics[@]}"; do
      curl -sf --max-time 5 "${metrics[$k]}" >"${proms[$k]%.prom}.settled.prom" || : >"${proms[$k]%.prom}.settled.prom"
    done
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$row" "$title" "$round" "$status" \
    "$WORK/$name.json" "$SIMS_HITS" "$SIMS_PROMPT" "$SIMS_SPLIT" "$(IFS=,; echo "${proms[*]}")" "$peers" >>"$REPL"
  stop_pids "${pids[@]}"
  [[ -z $NATS_PID ]] || stop_pids "$NATS_PID"
  NATS_PID=
  stop_sims
}

replicas_section() {
  local round mode k i nrows=${#REPL_ROWS[@]} row title
  log "replicas: $REPL_ROUNDS round(s) of ${nrows} rows x ${#REPL_MODES[@]} modes, workload $REPL_CONVERSATIONS conversations x $REPL_TURNS turns, concurrency $REPL_CONCURRENCY"
  for round in $(seq 1 "$REPL_ROUNDS"); do
    for mode in "${REPL_MODES[@]}"; do
      for k in $(seq 0 $((nrows - 1))); do
        i=$(((k + round - 1) % nrows))
        IFS='|' read -r row title <<<"${REPL_ROWS[$i]}"
        [[ -z ${REPL_ROWS_ONLY:-} || ",$REPL_ROWS_ONLY," == *",$row,"* ]] || continue
        [[ $row != shadow || ",${REPL_ROWS_ONLY:-}," == *",shadow,"* ]] || continue
        repl_row "$mode" "$round" "$row" "$title"
      done
    done
  done
}
