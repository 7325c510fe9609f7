#!/bin/sh
# First start: initdb with POSTGRES_USER / POSTGRES_PASSWORD, create POSTGRES_DB, accept
# password logins from the stack's network. Every start: run postgres in the foreground.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
  initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pw" --auth-local=trust \
    --auth-host=scram-sha-256 -E UTF8 >/dev/null
  rm -f "$pw"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    createdb -U "$POSTGRES_USER" "$POSTGRES_DB"
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
