#!/usr/bin/env bash
# The main job: serve the control plane on the embedded default (SQLite under .crucible/,
# the local Docker engine), run every bundled suite with the oracle (every reward must be 1)
# and with a no-op policy (every reward must be 0), print the summaries and the records'
# paths, then stop the server. Called by `make demo` after `make setup images`.
set -euo pipefail
cd "$(dirname "$0")/.."
CRUCIBLE=.venv/bin/crucible
export CRUCIBLE_DATA_DIR="${CRUCIBLE_DATA_DIR:-.crucible}"
mkdir -p "$CRUCIBLE_DATA_DIR/logs"
port="${CRUCIBLE_PORT:-8000}"
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  port=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
fi
export CRUCIBLE_PORT="$port" CRUCIBLE_URL="http://127.0.0.1:$port"
export COLUMNS="${COLUMNS:-140}"  # rich tables stay readable when the output is a log
CRUCIBLE_API_KEY=$($CRUCIBLE keys create --tenant demo --name demo --json \
  | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["key"])')
export CRUCIBLE_API_KEY

log="$CRUCIBLE_DATA_DIR/logs/serve.log"
$CRUCIBLE serve --log-level warning >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
ready=
for _ in $(seq 1 240); do
  if .venv/bin/python -c "import httpx,sys; sys.exit(httpx.get('$CRUCIBLE_URL/readyz').status_code != 200)" 2>/dev/null; then
    ready=1
    break
  fi
  kill -0 $server 2>/dev/null || { echo "crucible serve exited; see $log" >&2; tail -20 "$log" >&2; exit 1; }
  sleep 0.5
done
[ -n "$ready" ] || { echo "crucible serve is not ready after 120 s; see $log" >&2; tail -20 "$log" >&2; exit 1; }
echo "demo: control plane at $CRUCIBLE_URL (log $log)"
echo "demo: dashboard at $CRUCIBLE_URL/dashboard (sign in with an API key, e.g. \$CRUCIBLE_API_KEY)"

suites=()
for d in tasks/*/; do
  d=${d%/}
  case "$(basename "$d")" in _*|.*) continue;; esac
  if compgen -G "$d/*/task.toml" >/dev/null || compgen -G "$d/*/task.yaml" >/dev/null; then suites+=("$d"); fi
done
for suite in "${suites[@]}"; do
  echo; echo "== $suite: oracle (every reward must be 1) =="
  $CRUCIBLE rollout --suite "$suite" --policy oracle --expect-reward 1 --out records
  echo; echo "== $suite: no-op (every reward must be 0) =="
  $CRUCIBLE rollout --suite "$suite" --policy noop --expect-reward 0 --out records
done
echo; echo "demo: done; records are under records/ (JSONL and Parquet, one pair per job)"
