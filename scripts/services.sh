#!/usr/bin/env bash
# Start the services the integration tests use (idempotent; `make test` and `.ci/run` run it):
#   PostgreSQL 15 (if installed): started, role crucible/crucible and database crucible_test
#   Redis: installed with apt-get if missing, started on 127.0.0.1:6379
# Status lines go to stderr; the env exports go to stdout, so: eval "$(scripts/services.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .crucible/logs

say() { printf 'services: %s\n' "$*" >&2; }
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else return 1
  fi
}
as_postgres() { (cd / && as_root su postgres -c "$1"); }

PG_VERSION=${PG_VERSION:-15}
PG_URL=postgresql+psycopg://crucible:crucible@127.0.0.1:5432/crucible_test
REDIS_URL=redis://127.0.0.1:6379/0

# --------------------------------------------------------------------------- PostgreSQL
pg_ok=
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d "/etc/postgresql/$PG_VERSION/main" ]; then
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    say "postgres: starting cluster $PG_VERSION/main"
    as_root pg_ctlcluster "$PG_VERSION" main start
    for _ in $(seq 40); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.25; done
  fi
  if pg_isready -q -h 127.0.0.1 -p 5432; then
    if [ "$(as_postgres "psql -tAc \"SELECT 1 FROM pg_roles WHERE rolname = 'crucible'\"")" != 1 ]; then
      as_postgres "psql -q -c \"CREATE ROLE crucible LOGIN CREATEDB PASSWORD 'crucible'\""
      say "postgres: created role crucible"
    fi
    if [ "$(as_postgres "psql -tAc \"SELECT 1 FROM pg_database WHERE datname = 'crucible_test'\"")" != 1 ]; then
      as_postgres "createdb -O crucible crucible_test"
      say "postgres: created database crucible_test"
    fi
    say "postgres: ready at 127.0.0.1:5432"
    pg_ok=1
  else
    say "postgres: cluster $PG_VERSION/main did not start (see /var/log/postgresql/)"
  fi
else
  say "postgres: PostgreSQL $PG_VERSION is not installed; tests marked 'postgres' need it"
fi

# --------------------------------------------------------------------------- Redis
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
redis_ok=
if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  say "redis: installing redis-server (apt-get)"
  as_root apt-get update -qq >/dev/null 2>&1 || true
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    redis-server >.crucible/logs/apt-redis.log 2>&1 || say "redis: apt-get install failed"
fi
if command -v redis-server >/dev/null 2>&1; then
  if ! redis_up; then
    say "redis: starting redis-server"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no \
      --logfile "$PWD/.crucible/logs/redis.log" >/dev/null
    for _ in $(seq 40); do redis_up && break; sleep 0.25; done
  fi
  if redis_up; then say "redis: ready at 127.0.0.1:6379"; redis_ok=1; else say "redis: did not start"; fi
else
  say "redis: not installed and apt-get unavailable"
fi

[ -n "$pg_ok" ] && echo "export CRUCIBLE_TEST_POSTGRES_URL=$PG_URL"
[ -n "$redis_ok" ] && echo "export CRUCIBLE_TEST_REDIS_URL=$REDIS_URL"
exit 0
