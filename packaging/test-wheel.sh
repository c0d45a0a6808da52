#!/usr/bin/env bash
# The wheel as a user meets it: built (build-wheel.sh), installed with pip into a fresh venv, then
# `mmrouter --version`, `mmrouter demo` answering a chat, and `mmrouter serve --model-dir qwen3-vl
# --worker URL` in front of an `mmrouter sim` answering one — every process on 127.0.0.1, every one
# stopped at the end. Prints what each step took.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
start=$(date +%s)
step() { echo "test-wheel: $1 ($(( $(date +%s) - start )) s)"; }
fail() { echo "test-wheel: FAILED: $1" >&2; for f in "$work"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done; exit 1; }

wheel=$(bash packaging/build-wheel.sh "$work/dist" | tail -1)
step "built $(basename "$wheel")"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --no-index "$wheel"
mmrouter=$work/venv/bin/mmrouter
[[ -x $mmrouter ]] || fail "pip did not install mmrouter into the venv's bin/"
step "installed into a fresh venv"

version=$("$mmrouter" --version)
[[ $version == "mmrouter $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"* ]] || fail "--version: $version"
step "$version"

# Starts a process in the background, logging to $work/NAME.log; waits for its address in the log.
start_bg() {
  local name=$1 pattern=$2; shift 2
  "$@" > "$work/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do
    addr=$(sed -n "s|.*$pattern http://\([0-9.:]*\).*|\1|p" "$work/$name.log" | head -1)
    [[ -n $addr ]] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || fail "$name exited"
    sleep 0.1
  done
  fail "$name did not log its address"
}

# One chat through the router at $1; prints the worker that answered.
chat() {
  local headers=$work/headers body
  body=$(curl -sS --noproxy '*' --max-time 30 -D "$headers" "http://$1/v1/chat/completions" \
    -H 'content-type: application/json' \
    -d '{"model":"Qwen/Qwen3-VL-8B-Instruct","max_tokens":8,"messages":[{"role":"user","content":"Hello!"}]}') \
    || fail "chat through $1"
  grep -q '^HTTP/1.1 200' "$headers" || fail "chat through $1: $(head -1 "$headers") $body"
  [[ $body == *'"choices"'* ]] || fail "chat through $1: $body"
  sed -n 's/^x-mmrouter-worker: *\([^[:space:]]*\).*/\1/p' "$headers"
}

start_bg demo "proxy on" "$mmrouter" demo --port 0 --workers 1 --model qwen3-vl
worker=$(chat "$addr")
step "demo answered a chat (worker $worker)"

start_bg sim "listening on" "$mmrouter" sim --port 0 --model-dir qwen3-vl
sim=$addr
start_bg serve "listening on" env RUST_LOG=info "$mmrouter" serve --model-dir qwen3-vl --worker "http://$sim" --listen 127.0.0.1:0
worker=$(chat "$addr")
[[ $worker == worker-0 ]] || fail "serve from flags: the chat went to '$worker', not worker-0"
step "serve --model-dir qwen3-vl --worker http://$sim answered a chat (worker $worker)"
echo "test-wheel: ok in $(( $(date +%s) - start )) s"
