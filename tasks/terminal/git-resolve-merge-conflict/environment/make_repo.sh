#!/bin/bash
# Builds the repository in a conflicted merge state, deterministically: make_repo.sh DIR
set -euo pipefail
R=${1:-/app/shopcalc}
rm -rf "$R"; mkdir -p "$R"; cd "$R"
export GIT_AUTHOR_NAME="Sam Okoro" GIT_AUTHOR_EMAIL="sam@example.com"
export GIT_COMMITTER_NAME="Sam Okoro" GIT_COMMITTER_EMAIL="sam@example.com"
n=0
commit() {
  n=$((n+1))
  export GIT_AUTHOR_DATE="2024-05-$(printf %02d $n)T12:00:00+00:00" GIT_COMMITTER_DATE="2024-05-$(printf %02d $n)T12:00:00+00:00"
  git add -A && git commit -q -m "$1"
}
git init -q -b main .
git config user.name "Sam Okoro"; git config user.email "sam@example.com"
mkdir -p shopcalc tests
: > shopcalc/__init__.py
printf '__pycache__/\n.pytest_cache/\n' > .gitignore
cat > shopcalc/pricing.py <<'PY'
"""Price calculations. All amounts are integer cents."""

VAT_RATE = 20  # percent


def gross_cents(net_cents):
    """Net price plus VAT, rounded half up to whole cents."""
    return (net_cents * (100 + VAT_RATE) + 50) // 100
PY
cat > tests/test_pricing.py <<'PY'
from shopcalc.pricing import gross_cents


def test_gross_default():
    assert gross_cents(1000) == 1200
PY
cat > CHANGELOG.md <<'MD'
# Changelog

## Unreleased

## 1.0.0
- First release.
MD
commit "Initial pricing module"
# ---- feature branch: discounts ----
git checkout -q -b feature/discounts
cat > shopcalc/pricing.py <<'PY'
"""Price calculations. All amounts are integer cents."""

VAT_RATE = 20  # percent


def gross_cents(net_cents, discount_pct=0):
    """Net price minus a percentage discount, plus VAT, rounded half up to whole cents.

    The discount is applied to the net price before VAT is added.
    """
    if not 0 <= discount_pct <= 100:
        raise ValueError("discount_pct must be between 0 and 100")
    discounted = net_cents * (100 - discount_pct)  # in 1/100 cents
    return (discounted * (100 + VAT_RATE) + 5000) // 10000
PY
cat > tests/test_discounts.py <<'PY'
import pytest

from shopcalc.pricing import gross_cents


def test_discount_before_vat():
    assert gross_cents(1000, discount_pct=10) == 1080


def test_full_discount():
    assert gross_cents(999, discount_pct=100) == 0


def test_invalid_discount():
    with pytest.raises(ValueError):
        gross_cents(100, discount_pct=120)
PY
cat > shopcalc/coupons.py <<'PY'
COUPONS = {"SPRING10": 10, "VIP25": 25}


def discount_for(code):
    return COUPONS.get(code.strip().upper(), 0)
PY
cat > CHANGELOG.md <<'MD'
# Changelog

## Unreleased
- Add percentage discounts (`discount_pct`) and coupon codes.

## 1.0.0
- First release.
MD
commit "Add percentage discounts and coupons"
# ---- main: regional VAT ----
git checkout -q main
cat > shopcalc/pricing.py <<'PY'
"""Price calculations. All amounts are integer cents."""

VAT_RATES = {"UK": 20, "DE": 19, "FR": 20, "IE": 23}  # percent


def gross_cents(net_cents, region="UK"):
    """Net price plus the region's VAT, rounded half up to whole cents."""
    try:
        rate = VAT_RATES[region]
    except KeyError:
        raise ValueError(f"unknown region {region!r}") from None
    return (net_cents * (100 + rate) + 50) // 100
PY
cat > tests/test_pricing.py <<'PY'
import pytest

from shopcalc.pricing import gross_cents


def test_gross_default():
    assert gross_cents(1000) == 1200


def test_gross_region():
    assert gross_cents(1000, region="DE") == 1190
    assert gross_cents(999, region="IE") == 1229


def test_unknown_region():
    with pytest.raises(ValueError):
        gross_cents(1000, region="XX")
PY
cat > CHANGELOG.md <<'MD'
# Changelog

## Unreleased
- Support regional VAT rates (`region`).

## 1.0.0
- First release.
MD
commit "Support regional VAT rates"
# ---- start the merge, which conflicts ----
export GIT_COMMITTER_DATE="2024-05-10T12:00:00+00:00" GIT_AUTHOR_DATE="2024-05-10T12:00:00+00:00"
git merge --no-ff feature/discounts -m "Merge branch 'feature/discounts'" >/dev/null 2>&1 || true
test -f .git/MERGE_HEAD
