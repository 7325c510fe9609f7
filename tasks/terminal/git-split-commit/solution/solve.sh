#!/bin/bash
set -euo pipefail
cd /app/textstats
orig=$(git rev-parse HEAD)
export GIT_AUTHOR_NAME="$(git log -1 --format=%an "$orig")"
export GIT_AUTHOR_EMAIL="$(git log -1 --format=%ae "$orig")"
export GIT_AUTHOR_DATE="$(git log -1 --format=%aI "$orig")"
git reset -q HEAD~1
# commit 1: the bug fix only
python3 - <<'PY'
import re
core = open("textstats/core.py").read()
core = core[: core.index("\n\ndef top_words")] + "\n"
open("textstats/core.py", "w").write(core)
log = open("CHANGELOG.md").read()
log = "".join(l for l in log.splitlines(True) if "textstats.cli" not in l)
open("CHANGELOG.md", "w").write(log)
PY
git add textstats/core.py tests/test_core.py CHANGELOG.md
git commit -q -m "Fix hyphenated word counting"
# commit 2: everything else, i.e. the original final state
git checkout "$orig" -- .
git add -A
git commit -q -m "Add command-line interface"
test "$(git rev-parse HEAD^{tree})" = "$(git rev-parse "$orig^{tree}")"
