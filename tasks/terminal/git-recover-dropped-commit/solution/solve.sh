#!/bin/bash
set -euo pipefail
cd /app/ledger
git config user.name >/dev/null || git config user.name "Oracle"
git config user.email >/dev/null || git config user.email "oracle@example.com"
git checkout -q main
# find the lost commits in the reflog of HEAD/main by their exact subjects
rules=$(git log -g --format='%H %s' HEAD | awk '!f && / Add VAT rounding rules$/ {print $1; f=1}')
tests=$(git log -g --format='%H %s' HEAD | awk '!f && / Add tests for VAT rounding$/ {print $1; f=1}')
# a fixed committer date: the new commits' hashes (which cherry-pick prints) are then the
# same on every run, so a replay of this oracle matches its output exactly
GIT_COMMITTER_DATE="2024-03-01T12:00:00+00:00" git cherry-pick "$rules" "$tests"
find . -name __pycache__ -prune -exec rm -rf {} +
