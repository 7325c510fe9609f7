#!/usr/bin/env bash
# The local stack (docker-compose.yml): `make stack` runs `scripts/stack.sh up`, `make
# stack-down` runs `scripts/stack.sh down`.
#   up    build what is missing (sandbox images via `make images`, the PostgreSQL, Redis and
#         Prometheus images from sandbox_images/ unless CRUCIBLE_STACK_IMAGES=official, the
#         control plane's image), `docker-compose up -d`, wait for both replicas' /readyz and
#         Prometheus's /-/ready, print the URLs and an admin key (made once per stack, kept
#         in the data dir)
#   down  remove the stack's containers, network and volumes, the sandboxes and snapshot
#         images its replicas made (label crucible.deployment=<deployment>) and its data dir
#   env   print the variables docker-compose.yml reads (eval "$(scripts/stack.sh env)")
# Environment: CRUCIBLE_STACK_PROJECT (compose project, default crucible-stack),
# CRUCIBLE_STACK_IMAGES (local | official), CRUCIBLE_STACK_BASE_IMAGE (default
# crucible/base:latest), CRUCIBLE_STACK_PORT_1 / _2 (8101, 8102),
# CRUCIBLE_STACK_PROMETHEUS_PORT (9190), CRUCIBLE_STACK_DATA_DIR
# (default .crucible/stack/<project>, absolute), CRUCIBLE_STACK_READY_S (180).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

say() { printf 'stack: %s\n' "$*" >&2; }
die() { printf 'stack: error: %s\n' "$*" >&2; exit 1; }

PROJECT=${CRUCIBLE_STACK_PROJECT:-crucible-stack}
[[ $PROJECT =~ ^[a-z0-9][a-z0-9_-]*$ ]] || die "CRUCIBLE_STACK_PROJECT must match [a-z0-9][a-z0-9_-]*"
export COMPOSE_PROJECT_NAME=$PROJECT
export CRUCIBLE_STACK_DATA_DIR=${CRUCIBLE_STACK_DATA_DIR:-$ROOT/.crucible/stack/$PROJECT}
export CRUCIBLE_STACK_DEPLOYMENT=${CRUCIBLE_STACK_DEPLOYMENT:-$PROJECT}
export CRUCIBLE_STACK_PORT_1=${CRUCIBLE_STACK_PORT_1:-8101}
export CRUCIBLE_STACK_PORT_2=${CRUCIBLE_STACK_PORT_2:-8102}
export CRUCIBLE_STACK_PROMETHEUS_PORT=${CRUCIBLE_STACK_PROMETHEUS_PORT:-9190}
export CRUCIBLE_STACK_BASE_IMAGE=${CRUCIBLE_STACK_BASE_IMAGE:-crucible/base:latest}
export CRUCIBLE_STACK_IMAGE=${CRUCIBLE_STACK_IMAGE:-crucible-stack/control-plane:latest}
case ${CRUCIBLE_STACK_IMAGES:-local} in
  local)
    export CRUCIBLE_STACK_POSTGRES_IMAGE=crucible-stack/postgres:15
    export CRUCIBLE_STACK_REDIS_IMAGE=crucible-stack/redis:7
    export CRUCIBLE_STACK_PROMETHEUS_IMAGE=crucible-stack/prometheus:2 ;;
  official)
    export CRUCIBLE_STACK_POSTGRES_IMAGE=postgres:15
    export CRUCIBLE_STACK_REDIS_IMAGE=redis:7
    export CRUCIBLE_STACK_PROMETHEUS_IMAGE=prom/prometheus:v2.53.0 ;;
  *) die "CRUCIBLE_STACK_IMAGES must be local or official" ;;
esac
[[ $CRUCIBLE_STACK_DATA_DIR = /* ]] || die "CRUCIBLE_STACK_DATA_DIR must be an absolute path"
LOGS=$ROOT/.crucible/logs
mkdir -p "$LOGS"

compose_bin() {  # docker-compose 1.29 (apt) or the compose v2 plugin
  if command -v docker-compose >/dev/null 2>&1; then echo docker-compose; return; fi
  if docker compose version >/dev/null 2>&1; then echo "docker compose"; return; fi
  command -v apt-get >/dev/null 2>&1 || die "docker-compose not found: install compose >= 1.29"
  say "installing docker-compose (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends docker-compose; } >"$LOGS/apt-compose.log" 2>&1 \
    || die "apt-get install docker-compose failed (log: $LOGS/apt-compose.log)"
  echo docker-compose
}
compose() { $COMPOSE -p "$PROJECT" -f "$ROOT/docker-compose.yml" "$@"; }

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

build_image() {  # build_image TAG CONTEXT [DOCKERFILE]: quiet docker build, log on failure
  local log="$LOGS/stack-build-${1//[\/:]/-}.log"
  say "building $1 (log: $log)"
  docker build -t "$1" --build-arg "BASE_IMAGE=$CRUCIBLE_STACK_BASE_IMAGE" \
    ${3:+-f "$3"} "$2" >"$log" 2>&1 || { tail -20 "$log" >&2; die "building $1 failed"; }
}

prepare_context() {  # build/stack/: the dependency list and this host's CA bundle
  mkdir -p build/stack
  python3 - >build/stack/requirements.txt.new <<'EOF'
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))
EOF
  mv build/stack/requirements.txt.new build/stack/requirements.txt
  local ca
  for ca in "${CRUCIBLE_STACK_CA_BUNDLE:-}" /etc/ssl/certs/ca-certificates.crt; do
    if [ -n "$ca" ] && [ -f "$ca" ]; then cmp -s "$ca" build/stack/ca.pem || cp "$ca" build/stack/ca.pem; return; fi
  done
  : >build/stack/ca.pem
}

wait_ready() {  # wait_ready PORT... [/PATH]: until each port answers 200 on PATH (/readyz)
  local deadline=$((SECONDS + ${CRUCIBLE_STACK_READY_S:-180})) port path=/readyz
  [[ ${!#} = /* ]] && path=${!#} && set -- "${@:1:$#-1}"
  for port in "$@"; do
    until curl -fs -o /dev/null "http://127.0.0.1:$port$path" 2>/dev/null; do
      if [ "$SECONDS" -ge "$deadline" ]; then
        compose ps >&2; compose logs --tail 30 >&2
        die "replica on port $port not ready within ${CRUCIBLE_STACK_READY_S:-180} s"
      fi
      sleep 1
    done
  done
}

admin_key() {  # one admin key per stack, kept in the data dir
  local file=$CRUCIBLE_STACK_DATA_DIR/admin.key
  if [ ! -s "$file" ]; then
    compose exec -T replica-1 crucible keys create --tenant admin --admin --name stack --json \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["key"])' >"$file.new"
    mv "$file.new" "$file"
    chmod 600 "$file"
  fi
  cat "$file"
}

up() {
  local t0=$SECONDS
  if ! have_image crucible/terminal:latest || ! have_image crucible/base:latest; then
    say "sandbox images missing: make images"
    make images >&2
  fi
  prepare_context
  if [ "${CRUCIBLE_STACK_IMAGES:-local}" = local ]; then
    build_image "$CRUCIBLE_STACK_POSTGRES_IMAGE" sandbox_images/postgres
    build_image "$CRUCIBLE_STACK_REDIS_IMAGE" sandbox_images/redis
    build_image "$CRUCIBLE_STACK_PROMETHEUS_IMAGE" sandbox_images/prometheus
  fi
  build_image "$CRUCIBLE_STACK_IMAGE" . Dockerfile
  mkdir -p "$CRUCIBLE_STACK_DATA_DIR"
  say "starting project $PROJECT (compose: $COMPOSE)"
  compose up -d --no-build >&2
  wait_ready "$CRUCIBLE_STACK_PORT_1" "$CRUCIBLE_STACK_PORT_2"
  wait_ready "$CRUCIBLE_STACK_PROMETHEUS_PORT" /-/ready
  local key
  key=$(admin_key)
  say "up in $((SECONDS - t0)) s"
  cat <<EOF
replica 1   http://127.0.0.1:$CRUCIBLE_STACK_PORT_1  (dashboard: http://127.0.0.1:$CRUCIBLE_STACK_PORT_1/dashboard)
replica 2   http://127.0.0.1:$CRUCIBLE_STACK_PORT_2  (dashboard: http://127.0.0.1:$CRUCIBLE_STACK_PORT_2/dashboard)
prometheus  http://127.0.0.1:$CRUCIBLE_STACK_PROMETHEUS_PORT  (targets: /targets; both replicas' /metrics every 5 s)
admin key   $key
worker      CRUCIBLE_STACK_API_KEY=<key> $COMPOSE -p $PROJECT --profile worker run --rm worker
down        make stack-down
EOF
}

down() {
  compose --profile worker down -v --remove-orphans --timeout 10 >&2
  local label="crucible.deployment=$CRUCIBLE_STACK_DEPLOYMENT" ids
  ids=$(docker ps -aq --filter "label=$label")
  if [ -n "$ids" ]; then say "removing sandboxes ($label)"; docker rm -f -v $ids >/dev/null; fi
  ids=$(docker images -q "crucible-snapshots/$CRUCIBLE_STACK_DEPLOYMENT" | sort -u)
  if [ -n "$ids" ]; then docker rmi -f $ids >/dev/null; fi
  rm -rf "$CRUCIBLE_STACK_DATA_DIR"
  say "project $PROJECT removed"
}

case ${1:-} in
  up) COMPOSE=$(compose_bin); up ;;
  down) COMPOSE=$(compose_bin); down ;;
  env)
    for v in COMPOSE_PROJECT_NAME CRUCIBLE_STACK_DATA_DIR CRUCIBLE_STACK_DEPLOYMENT \
      CRUCIBLE_STACK_PORT_1 CRUCIBLE_STACK_PORT_2 CRUCIBLE_STACK_BASE_IMAGE CRUCIBLE_STACK_IMAGE \
      CRUCIBLE_STACK_POSTGRES_IMAGE CRUCIBLE_STACK_REDIS_IMAGE CRUCIBLE_STACK_PROMETHEUS_IMAGE \
      CRUCIBLE_STACK_PROMETHEUS_PORT; do
      printf 'export %s=%q\n' "$v" "${!v}"
    done ;;
  *) die "usage: scripts/stack.sh up|down|env" ;;
esac
