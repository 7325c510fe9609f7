#!/bin/bash
# Builds /app/ledger deterministically: usage make_repo.sh DIR
set -euo pipefail
R=${1:-/app/ledger}
rm -rf "$R"; mkdir -p "$R"; cd "$R"
export GIT_AUTHOR_NAME="Rosa Diaz" GIT_AUTHOR_EMAIL="rosa@example.com"
export GIT_COMMITTER_NAME="Rosa Diaz" GIT_COMMITTER_EMAIL="rosa@example.com"
n=0
commit() { # message
  n=$((n+1))
  export GIT_AUTHOR_DATE="2024-03-0${n}T10:00:00+00:00" GIT_COMMITTER_DATE="2024-03-0${n}T10:00:00+00:00"
  git add -A && git commit -q -m "$1"
}
git init -q -b main .
git config user.name "Rosa Diaz"; git config user.email "rosa@example.com"
mkdir -p ledger tests
cat > ledger/__init__.py <<'PY'
PY
cat > ledger/money.py <<'PY'
from decimal import Decimal


def to_cents(amount):
    return int((Decimal(str(amount)) * 100).to_integral_value())
PY
cat > README.md <<'MD'
# ledger
Small bookkeeping helpers.
MD
commit "Initial commit"
cat > ledger/invoice.py <<'PY'
from .money import to_cents


def invoice_total_cents(lines):
    """lines: iterable of (qty, unit_price)"""
    return sum(qty * to_cents(price) for qty, price in lines)
PY
commit "Add invoice totals"
cat > tests/test_invoice.py <<'PY'
from ledger.invoice import invoice_total_cents


def test_total():
    assert invoice_total_cents([(2, "1.50"), (1, "0.99")]) == 399
PY
commit "Add invoice tests"
# --- the work that will be lost ---
cat > ledger/vat.py <<'PY'
from decimal import ROUND_HALF_EVEN, Decimal

RATES = {"standard": Decimal("0.20"), "reduced": Decimal("0.05"), "zero": Decimal("0")}


def vat_cents(net_cents, band="standard"):
    """VAT on a net amount in cents, rounded half-to-even (banker's rounding)."""
    return int((Decimal(net_cents) * RATES[band]).quantize(Decimal("1"), rounding=ROUND_HALF_EVEN))
PY
commit "Add VAT rounding rules"
cat > tests/test_vat.py <<'PY'
from ledger.vat import vat_cents


def test_standard():
    assert vat_cents(1000) == 200


def test_half_even():
    assert vat_cents(10, "reduced") == 0   # 0.5 -> 0
    assert vat_cents(30, "reduced") == 2   # 1.5 -> 2


def test_zero_band():
    assert vat_cents(12345, "zero") == 0
PY
commit "Add tests for VAT rounding"
# --- the accident ---
export GIT_COMMITTER_DATE="2024-03-06T09:00:00+00:00"
git reset -q --hard HEAD~2
n=6
cat >> README.md <<'MD'

## Usage
    from ledger.invoice import invoice_total_cents
MD
commit "Document usage in README"
# decoy branch with an older, different attempt
git checkout -q -b experiment HEAD~1
cat > ledger/vat.py <<'PY'
RATE = 0.2


def vat_cents(net_cents, band="standard"):
    return round(net_cents * RATE)
PY
n=7
commit "Add VAT rounding rules (first attempt)"
git checkout -q main
git config gc.reflogExpire never
git config gc.reflogExpireUnreachable never
git config gc.pruneExpire never
