#!/bin/bash
set -euo pipefail
cd /app/payments-service
export FILTER_BRANCH_SQUELCH_WARNING=1
git filter-branch -f \
  --index-filter '
    git rm -q --cached --ignore-unmatch deploy/.env
    if blob=$(git rev-parse -q --verify "$GIT_COMMIT:config/settings.py" 2>/dev/null); then
      new=$(git cat-file blob "$blob" | sed "s/sk_live_51Hx9TQ2eZvKYlo2CzQwR8f3/REDACTED/g" | git hash-object -w --stdin)
      mode=$(git ls-tree "$GIT_COMMIT" config/settings.py | cut -d" " -f1)
      git update-index --cacheinfo "$mode,$new,config/settings.py"
    fi' \
  --tag-name-filter cat -- --all >/dev/null
# drop the backup refs and every trace of the old objects
git for-each-ref --format='%(refname)' refs/original/ | xargs -r -n1 git update-ref -d
git reflog expire --expire=now --expire-unreachable=now --all
git gc -q --prune=now --aggressive
rm -f .git/ORIG_HEAD .git/FETCH_HEAD
git checkout -q main
git reset -q --hard
