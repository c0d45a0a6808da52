#!/usr/bin/env bash
# A test of the benchmark harness (issue 26): bench/run.sh must refuse an implausible figure.
# Runs `bench/run.sh --quick --no-build --no-peers` on the text shape once clean (it must pass and
# write its report) and once per corrupted figure (BENCH_CORRUPT=FIGURE: one measurement corrupted
# where it is recorded; the run must exit non-zero, name the figure in its log, and write no report).
# Each run takes the bench lock itself (flock on $BENCH_LOCK, default /tmp/mmrouter-bench.lock), so it
# never overlaps another benchmark: do not wrap this script in the same lock (it would wait on itself).
# Usage: bench/test-harness.sh [clean] [FIGURE...]   (default: clean and every figure; FIGURE is one of
#   router-cpu router-cpu-negative requests latency round). Env: MMROUTER_BIN, LOADGEN_BIN as for run.sh.
# About 10-20 s a run on 2 cores once built, plus any wait for the lock. Not in CI: it starts servers
# and loads the cores (the checks themselves are unit-tested by `python3 -m unittest discover -s bench`).
set -euo pipefail
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOCK=${BENCH_LOCK:-/tmp/mmrouter-bench.lock}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mmrouter-harness.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log() { printf '[harness %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# FIGURE -> the section that measures it and the failure line the run must print (an ERE).
declare -A SECTION=(
  [router-cpu]=throughput [router-cpu-negative]=throughput [requests]=overhead [latency]=overhead [round]=overhead
)
ROW='(overhead|throughput) / text / mmrouter kv exact'
declare -A EXPECT=(
  [router-cpu]="implausible: $ROW / run [0-9]+ / router CPU s = [0-9.]+ \(> [0-9.]+ s = [0-9]+ cores ×"
  [router-cpu-negative]="implausible: $ROW / run [0-9]+ / router CPU s = -[0-9.]+ \(CPU time over an interval must be ≥ 0\)"
  [requests]="implausible: $ROW / round [0-9]+ / requests = [0-9]+ \(the loadgen's count of requests sent; the harness asked for"
  [latency]="implausible: $ROW / round [0-9]+ / latency ms / p50 = [0-9.]+ \(must be ≤ p90"
  [round]="implausible: $ROW / round [0-9]+ / round id = [0-9]+ \(the report's own label is"
)

# bench SECTIONS NAME [ENV...]: one locked run.sh on the text shape; its log in $TMP/NAME.log, its
# report (if any) in $TMP/NAME.md; prints the exit status.
bench() {
  local sections=$1 name=$2 rc=0
  shift 2
  env "$@" BENCH_SHAPES=text BENCH_OUT="$TMP/$name.md" flock "$LOCK" \
    bash "$BENCH/run.sh" --quick --no-build --no-peers --only="$sections" >"$TMP/$name.out" 2>"$TMP/$name.log" || rc=$?
  echo "$rc"
}

FAILED=()
check() { # NAME CONDITION-MESSAGE: records a failed assertion
  FAILED+=("$1: $2")
  log "FAIL $1: $2 (log: $TMP/$1.log)"
}

run_clean() {
  log "clean run (overhead, throughput): must pass and write its report"
  local rc
  rc=$(bench overhead,throughput clean)
  [[ $rc == 0 ]] || check clean "exit status $rc, expected 0: $(grep -m3 'implausible\|FAILED' "$TMP/clean.log" | tr '\n' ' ')"
  [[ -s $TMP/clean.md ]] || check clean "no report written"
  grep -q 'router CPU µs/req' "$TMP/clean.md" 2>/dev/null || check clean "the report has no throughput table"
}

run_corrupt() {
  local fig=$1 rc line
  log "BENCH_CORRUPT=$fig (${SECTION[$fig]}): must fail naming the figure and write nothing"
  rc=$(bench "${SECTION[$fig]}" "$fig" BENCH_CORRUPT="$fig")
  [[ $rc != 0 ]] || check "$fig" "exit status 0, expected a failure"
  line=$(grep -E -m1 "${EXPECT[$fig]}" "$TMP/$fig.log" || true)
  if [[ -z $line ]]; then
    check "$fig" "no line matching /${EXPECT[$fig]}/ in the log"
  else
    log "  named: ${line#*\] }"
  fi
  [[ ! -e $TMP/$fig.md ]] || check "$fig" "a report was written despite the implausible figure"
}

CASES=("$@")
((${#CASES[@]})) || CASES=(clean router-cpu router-cpu-negative requests latency round)
for c in "${CASES[@]}"; do
  if [[ $c == clean ]]; then
    run_clean
  elif [[ -n ${SECTION[$c]:-} ]]; then
    run_corrupt "$c"
  else
    echo "unknown case $c (clean or one of ${!SECTION[*]})" >&2
    exit 2
  fi
done
if ((${#FAILED[@]})); then
  trap - EXIT
  log "${#FAILED[@]} failed assertion(s); logs kept in $TMP"
  exit 1
fi
log "ok: ${CASES[*]}"
