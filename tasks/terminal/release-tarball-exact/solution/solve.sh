#!/bin/bash
set -euo pipefail
export LC_ALL=C
stage=$(mktemp -d)
mkdir -p "$stage/myapp-1.4.2" /app/dist
cd /app/myapp
find . -type f \
  ! -path '*/__pycache__/*' ! -name '*.pyc' ! -name '*.swp' ! -name '.DS_Store' \
  ! -path './.env' ! -path './tests/*' ! -path './node_modules/*' -printf '%P\n' \
  | sort > "$stage/list"
# copy preserving modes
tar -cf - -T "$stage/list" | tar -xpf - -C "$stage/myapp-1.4.2"
(cd "$stage/myapp-1.4.2" && xargs -d '\n' sha256sum -- < "$stage/list" > MANIFEST.sha256)
tar -C "$stage" --owner=0 --group=0 --numeric-owner --sort=name -czf /app/dist/myapp-1.4.2.tar.gz myapp-1.4.2
rm -rf "$stage"
