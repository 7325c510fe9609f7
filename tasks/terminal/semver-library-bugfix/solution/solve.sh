#!/bin/bash
set -euo pipefail
cp "$(dirname "$0")/core_fixed.py" /app/semverlite/semverlite/core.py
cd /app/semverlite && python3 -m pytest -q -p no:cacheprovider >/dev/null
find /app/semverlite -name __pycache__ -prune -exec rm -rf {} +
