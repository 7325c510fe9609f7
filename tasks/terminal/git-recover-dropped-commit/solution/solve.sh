#!/bin/bash
set -euo pipefail
cd /app/ledger
git config user.name >/dev/null || git config user.name "Oracle"
git config user.email >/dev/null || git config user.email "oracle@example.com"
git checkout -q main
# find the lost commits in the reflog of HEAD/main by their exact subjects
rules=$(git log -g --format='%H %s' HEAD | awk '!f && / Add VAT rounding rules$/ {print $1; f=1}')
tests=$(git log -g --format='%H %s' HEAD | awk '!f && / Add tests for VAT rounding$/ {print $1; f=1}')
git cherry-pick "$rules" "$tests"
find . -name __pycache__ -prune -exec rm -rf {} +
