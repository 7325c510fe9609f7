#!/bin/bash
set -euo pipefail
cd /app/project
# 1. contents of text files outside vendor/
find . -path ./vendor -prune -o -type f -print0 \
  | while IFS= read -r -d '' f; do
      if grep -Iq . "$f"; then
        sed -i -e 's/acme_widgets/nova_gadgets/g' -e 's/acme-widgets/nova-gadgets/g' \
               -e 's/AcmeWidgets/NovaGadgets/g' -e 's/ACME_WIDGETS/NOVA_GADGETS/g' "$f"
      fi
    done
# 2. names, deepest first so parent renames do not invalidate child paths
find . -path ./vendor -prune -o -mindepth 1 -depth -print0 \
  | while IFS= read -r -d '' p; do
      dir=$(dirname "$p"); base=$(basename "$p")
      new=$(printf '%s' "$base" | sed -e 's/acme_widgets/nova_gadgets/g' -e 's/acme-widgets/nova-gadgets/g' \
               -e 's/AcmeWidgets/NovaGadgets/g' -e 's/ACME_WIDGETS/NOVA_GADGETS/g')
      if [ "$new" != "$base" ]; then mv -- "$p" "$dir/$new"; fi
    done
find . -name __pycache__ -prune -exec rm -rf {} +
rm -rf .pytest_cache
