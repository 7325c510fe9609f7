#!/bin/bash
# Builds /app/payments-service deterministically: make_repo.sh DIR
set -euo pipefail
R=${1:-/app/payments-service}
rm -rf "$R"; mkdir -p "$R"; cd "$R"
export GIT_AUTHOR_NAME="Priya Natarajan" GIT_AUTHOR_EMAIL="priya@example.com"
export GIT_COMMITTER_NAME="Priya Natarajan" GIT_COMMITTER_EMAIL="priya@example.com"
n=0
commit() { # message [author name] [author email]
  n=$((n+1))
  local d="2024-02-$(printf %02d $((n*2)))T09:30:00+01:00"
  GIT_AUTHOR_DATE="$d" GIT_COMMITTER_DATE="$d" \
  GIT_AUTHOR_NAME="${2:-Priya Natarajan}" GIT_AUTHOR_EMAIL="${3:-priya@example.com}" \
    git commit -q -m "$1"
}
git init -q -b main .
git config user.name "Priya Natarajan"; git config user.email "priya@example.com"
mkdir -p app config deploy
printf '# payments-service\n\nCharges cards through Stripe.\n' > README.md
: > app/__init__.py
git add -A; commit "Initial skeleton"
cat > app/client.py <<'PY'
import json
import urllib.request

from config import settings


def charge(amount_cents, currency="eur"):
    req = urllib.request.Request(settings.API_BASE + "/charges", method="POST",
                                 data=json.dumps({"amount": amount_cents, "currency": currency}).encode())
    req.add_header("Authorization", "Bearer " + settings.STRIPE_KEY)
    return urllib.request.urlopen(req, timeout=settings.TIMEOUT_S)
PY
git add -A; commit "Add payment client" "Tom Becker" "tom@example.com"
cat > config/settings.py <<'PY'
API_BASE = "https://api.stripe.example"
TIMEOUT_S = 10
STRIPE_KEY = "sk_live_51Hx9TQ2eZvKYlo2CzQwR8f3"  # TODO move out of the repo
PY
: > config/__init__.py
git add -A; commit "Add settings"
cat > deploy/deploy.sh <<'SH'
#!/bin/sh
set -e
. ./deploy/.env
echo "deploying payments-service to $DEPLOY_HOST"
SH
chmod +x deploy/deploy.sh
printf 'DEPLOY_HOST=pay-01.internal\nDB_USER=payments\nDB_PASSWORD=hunter2-prod-7731\n' > deploy/.env
git add -A; commit "Add deploy script" "Tom Becker" "tom@example.com"
echo "1.0.0" > VERSION
git add -A; commit "Release 1.0.0"
GIT_COMMITTER_DATE="2024-02-10T10:00:00+01:00" git tag -a v1.0.0 -m "Version 1.0.0"
# maintenance branch
git checkout -q -b release/1.x
sed -i 's/TIMEOUT_S = 10/TIMEOUT_S = 30/' config/settings.py
git add -A; commit "Hotfix: raise timeout to 30s" "Tom Becker" "tom@example.com"
git checkout -q main
cat > app/refunds.py <<'PY'
from app.client import charge


def refund(amount_cents, currency="eur"):
    return charge(-amount_cents, currency)
PY
git add -A; commit "Add refunds"
cat > config/settings.py <<'PY'
import os

API_BASE = "https://api.stripe.example"
TIMEOUT_S = 10
STRIPE_KEY = os.environ["STRIPE_KEY"]
PY
git add -A; commit "Read Stripe key from the environment"
printf '# payments-service\n\nCharges cards through Stripe.\nSet STRIPE_KEY before starting.\n' > README.md
git add -A; commit "Document STRIPE_KEY"
