# Helpers shared by the A/B scripts (bench/ab-cpu.sh, bench/ab-routing.sh); sourced, not run.
# AB_NAME names the calling script in its messages.

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits up to 10 s for URL to answer 2xx.
wait_http() {
  local url=$1 _
  for _ in $(seq 100); do curl -sf "$url" >/dev/null && return 0; sleep 0.1; done
  echo "${AB_NAME:-ab}: $url did not answer" >&2
  return 1
}
