# Shared set-up of the browser checks (sourced by each of their scripts): installs what they lack
# (Debian's chromium, node, python3, curl and the caller's $extra_apt; playwright-core from npm),
# builds the debug binary the test suite builds anyway, and gives $work, $pids (stopped on exit by
# PID), free_port, wait_http, serve_dir, start_sluice_with_password and enc. The caller sets
# $here, $repo, $name and log() first.

need_apt=()
command -v chromium >/dev/null || need_apt+=(chromium)
for tool in ${extra_apt:-}; do
  command -v "$tool" >/dev/null || need_apt+=("$tool")
done
command -v node >/dev/null || need_apt+=(nodejs npm)
command -v python3 >/dev/null || need_apt+=(python3)
command -v curl >/dev/null || need_apt+=(curl)
if ((${#need_apt[@]})); then
  log "installing ${need_apt[*]} from Debian"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [[ ! -d "$here/node_modules/playwright-core" ]]; then
  log "installing playwright-core (npm ci)"
  # playwright-core never downloads a browser by itself; the variable makes sure of it.
  (cd "$here" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi
CHROMIUM="${CHROMIUM:-$(command -v chromium)}"
export CHROMIUM

# The debug binary the test suite builds anyway.
(cd "$repo" && cargo build -p sluice --locked --quiet)
sluice="${CARGO_TARGET_DIR:-$repo/target}/debug/sluice"

work="$(mktemp -d "/tmp/sluice-$name-check.XXXXXX")"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_http() {
  for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  log "nothing answers at $1"; return 1
}

# Serves directory $2 over plain HTTP on a free loopback port, whose number goes into variable $1.
serve_dir() {
  local port
  port=$(free_port)
  python3 -m http.server "$port" --bind 127.0.0.1 --directory "$2" >"$work/http-$port.log" 2>&1 &
  pids+=($!)
  printf -v "$1" '%s' "$port"
}

# Starts sluice with an API password (so CORS is on for the page's origin and child URLs are
# sealed tokens) and private upstreams allowed; sets $password, $proxy and waits for /health.
start_sluice_with_password() {
  local port
  port=$(free_port)
  password="$name-check-$RANDOM$RANDOM"
  cat >"$work/sluice.toml" <<CONF
[server]
listen = ["127.0.0.1:$port"]
[upstream]
allow_private = true
[auth]
api_password = "$password"
CONF
  "$sluice" serve --config "$work/sluice.toml" >"$work/sluice.log" 2>&1 &
  pids+=($!)
  proxy="http://127.0.0.1:$port"
  wait_http "$proxy/health"
}

# $1 percent-encoded for a query parameter.
enc() { python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$1"; }
