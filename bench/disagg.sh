# shellcheck shell=bash
# The `disagg` section of bench/run.sh (sourced by it; uses its helpers: free_port, wait_http, stop_pids,
# start_router, stop_router, fail, log, the routing workload and the load generator).
#
# Disaggregated serving (issue 47) on simulated roles: every run starts a fresh pool of sims in roles on
# 127.0.0.1 — DIS_ROLES, by default 2 prefill + 2 decode + 4 encode, all given one fresh
# --ec-shared-storage directory (the encoders write each image's embeddings there, prefill loads them) —
# and mmrouter in front (approximate mode: no KV events; the residency model is fed by the router's own
# exact dispatches either way). Two comparisons, the rows of each taking turns round by round:
#   prefill  the routing section's multimodal workload; the prefill worker chosen by
#              kv     exact KV overlap (policy "kv", exact accounting: images included)
#              text   the text prefix only ([model] exact_accounting = false; a fallback plan names no
#                     image, so its encode leg goes to the least loaded encoder)
#              rr     round-robin (policy "round_robin")
#   encode   the shared-images workload (one-turn requests, each its own system prompt, then one of
#            DIS_IMAGES images of DIS_IMAGE_PX² pixels); the encode worker chosen by [routing]
#            encode_policy = residency (the default) | round_robin | hash_ring, prefill by kv exact.
#            DIS_QUEUE_WEIGHTS ("0.25 4") adds residency rows with those encode_queue_weight values.
# The sims run at the simulator's default image and transfer costs (crates/sim/src/options.rs: preprocess
# 5 µs and encode 10 µs per image token, a KV pull 2 µs per token; encoder cache 16384 tokens, processor
# cache 4 GiB) and run.sh's timing model (5 ms + 20 µs per uncached prompt token, 1 ms per output token).
# DIS_ROUNDS rounds; in each, every row of both comparisons, in an order rotated each round.
# DIS_ROWS_ONLY (e.g. "residency,rr") keeps those rows, DIS_WL_ONLY (prefill or encode) that comparison.
# Output: rows appended to $DIS (run.sh's $WORK/disagg.tsv, read by report.py --disagg): comparison, row,
# title, round, status, loadgen json, requests asked, the sims' /metrics scrapes after the run
# (comma-separated ROLE=FILE), the router's /metrics scrape after the run.

DIS_PREFILL_ROWS=(
  "kv|prefill by exact KV overlap (kv, exact)|kv|true|"
  "text|prefill by text prefix (kv, exact_accounting = false)|kv|false|"
  "rr|prefill round-robin (policy round_robin)|round_robin|true|"
)
DIS_ENCODE_ROWS=(
  "residency|encoders by residency (default)|kv|true|encode_policy = \"residency\""
  "rr|encoders round-robin|kv|true|encode_policy = \"round_robin\""
  "ring|encoders by hash ring|kv|true|encode_policy = \"hash_ring\""
)
for _qw in ${DIS_QUEUE_WEIGHTS:-}; do
  DIS_ENCODE_ROWS+=("residency-qw$_qw|encoders by residency, encode_queue_weight = $_qw|kv|true|encode_policy = \"residency\"
encode_queue_weight = $_qw")
done
unset _qw
read -ra DIS_ROLE_LIST <<<"${DIS_ROLES:-prefill prefill decode decode encode encode encode encode}"

# dis_images DIR N PX: N distinct PNGs of PX×PX pixels (Qwen3-VL: (PX/32)² encoder tokens, 1024 for
# 1024 px), each a flat grey with its own index in the first row, so every one has its own content hash.
dis_images() {
  python3 - "$1" "$2" "$3" <<'EOF'
import os, struct, sys, zlib
out, n, px = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(out, exist_ok=True)
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
for i in range(n):
    first = bytearray([128] * (3 * px))
    first[0:8] = i.to_bytes(8, "big")
    rows = b"\0" + bytes(first) + (b"\0" + bytes([128] * (3 * px))) * (px - 1)
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", px, px, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))
    with open(os.path.join(out, f"image-{i:03d}.png"), "wb") as f:
        f.write(png)
EOF
}

# dis_workloads: the shared-images workload over DIS_IMAGES generated images (the prefill comparison
# runs the routing section's multimodal workload).
dis_workloads() {
  dis_images "$WORK/disagg-images" "$DIS_IMAGES" "$DIS_IMAGE_PX"
  "$LOADGEN" workload --seed "$SEED" --shape shared-images --images "$DIS_IMAGES" --images-dir "$WORK/disagg-images" \
    --conversations "$DIS_REQUESTS" --max-tokens "$MAX_TOKENS" --out "$WORK/disagg-encode.jsonl" >&2
  cp "$WORK/workload.jsonl" "$WORK/disagg-prefill.jsonl"
}

# dis_start_sims: fresh sims in DIS_ROLE_LIST's roles sharing one fresh EC storage directory; fills
# run.sh's SIM_URLS, SIM_PIDS, SIM_ROLES (write_config gives each worker its role).
dis_start_sims() {
  local i port pid role ec
  ec=$(mktemp -d "$WORK/disagg-ec.XXXXXX")
  SIM_URLS=() SIM_PIDS=() SIM_EVENTS=() SIM_ROLES=()
  for i in "${!DIS_ROLE_LIST[@]}"; do
    role=${DIS_ROLE_LIST[$i]}
    port=$(free_port)
    "$MMR" sim "${SIM_HOST_ARG[@]+"${SIM_HOST_ARG[@]}"}" --port "$port" --name "$role$i" --role "$role" \
      --ec-shared-storage "$ec" --block-size 16 --kv-blocks "$KV_BLOCKS" --ttft-base-ms "$TTFT_BASE_MS" \
      --prefill-us-per-token "$PREFILL_US" --decode-ms-per-token "$DECODE_MS" --max-output-tokens "$MAX_TOKENS" \
      --seed "$((SEED + i))" >"$WORK/disagg-sim$i.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    SIM_PIDS+=("$pid")
    SIM_URLS+=("http://127.0.0.1:$port")
    SIM_ROLES+=("$role")
  done
  for i in "${!SIM_URLS[@]}"; do
    wait_http "${SIM_URLS[$i]}/health" 60 "${SIM_PIDS[$i]}" || {
      echo "disagg sim$i (${SIM_ROLES[$i]}) did not start: $(tail -n 3 "$WORK/disagg-sim$i.log")" >&2
      exit 1
    }
  done
}

# dis_run COMPARISON ROUND ROW TITLE POLICY EXACT ROUTING: one run on fresh sims; appends its row to $DIS.
dis_run() {
  local cmp=$1 round=$2 row=$3 title=$4 policy=$5 exact=$6 routing=$7 name status=ok i scrapes= asked
  name="disagg-$cmp-$row-$round"
  asked=$(wc -l <"$WORK/disagg-$cmp.jsonl")
  log "disagg round $round, $cmp: $title"
  dis_start_sims
  ROUTER_ROUTING_TOML=$routing
  if ! start_router "mmrouter:$policy:$exact" "$name"; then
    ROUTER_ROUTING_TOML=
    printf '%s\t%s\t%s\t%s\tn/a (%s)\t\t%s\t\t\n' "$cmp" "$row" "$title" "$round" "$ROUTER_ERR" "$asked" >>"$DIS"
    fail "disagg $name" "$ROUTER_ERR"
    dis_stop_sims
    return 0
  fi
  ROUTER_ROUTING_TOML=
  "$LOADGEN" loadgen --url "$ROUTER_URL" --workload "$WORK/disagg-$cmp.jsonl" --concurrency "$DIS_CONCURRENCY" \
    --timeout-secs 120 --label "$name" --json-out "$WORK/$name.json" >&2 || {
    status="n/a (loadgen failed)"
    fail "disagg $name" "loadgen failed (see the log above)"
  }
  for i in "${!SIM_URLS[@]}"; do
    curl -sf --max-time 5 "${SIM_URLS[$i]}/metrics" >"$WORK/$name-sim$i.prom" || true
    scrapes+="${scrapes:+,}${SIM_ROLES[$i]}=$WORK/$name-sim$i.prom"
  done
  curl -sf --max-time 5 "$ROUTER_METRICS" >"$WORK/$name-router.prom" || true
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$cmp" "$row" "$title" "$round" "$status" "$WORK/$name.json" \
    "$asked" "$scrapes" "$WORK/$name-router.prom" >>"$DIS"
  stop_router
  dis_stop_sims
}

dis_stop_sims() { stop_sims; SIM_ROLES=(); }

disagg_section() {
  local round cmp k i n row title policy exact routing rows
  dis_workloads
  log "disagg: $DIS_ROUNDS round(s); ${DIS_ROLE_LIST[*]}; shared images: $DIS_REQUESTS requests over $DIS_IMAGES images of ${DIS_IMAGE_PX}x${DIS_IMAGE_PX} px; concurrency $DIS_CONCURRENCY"
  for round in $(seq 1 "$DIS_ROUNDS"); do
    for cmp in prefill encode; do
      [[ -z ${DIS_WL_ONLY:-} || $DIS_WL_ONLY == "$cmp" ]] || continue
      if [[ $cmp == prefill ]]; then rows=("${DIS_PREFILL_ROWS[@]}"); else rows=("${DIS_ENCODE_ROWS[@]}"); fi
      n=${#rows[@]}
      for k in $(seq 0 $((n - 1))); do
        i=$(((k + round - 1) % n))
        IFS='|' read -r row title policy exact routing <<<"${rows[$i]%%$'\n'*}"
        # A row's [routing] lines may span lines (the queue-weight rows): keep everything after the 4th '|'.
        routing=${rows[$i]#*|*|*|*|}
        [[ -z ${DIS_ROWS_ONLY:-} || ",$DIS_ROWS_ONLY," == *",$row,"* ]] || continue
        dis_run "$cmp" "$round" "$row" "$title" "$policy" "$exact" "$routing"
      done
    done
  done
}
