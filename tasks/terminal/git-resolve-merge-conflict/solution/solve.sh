#!/bin/bash
set -euo pipefail
cd /app/shopcalc
cat > shopcalc/pricing.py <<'PY'
"""Price calculations. All amounts are integer cents."""

VAT_RATES = {"UK": 20, "DE": 19, "FR": 20, "IE": 23}  # percent


def gross_cents(net_cents, region="UK", discount_pct=0):
    """Net price minus a percentage discount, plus the region's VAT, rounded half up.

    The discount is applied to the net price before VAT is added; rounding happens once.
    """
    try:
        rate = VAT_RATES[region]
    except KeyError:
        raise ValueError(f"unknown region {region!r}") from None
    if not 0 <= discount_pct <= 100:
        raise ValueError("discount_pct must be between 0 and 100")
    discounted = net_cents * (100 - discount_pct)  # in 1/100 cents
    return (discounted * (100 + rate) + 5000) // 10000
PY
cat > CHANGELOG.md <<'MD'
# Changelog

## Unreleased
- Support regional VAT rates (`region`).
- Add percentage discounts (`discount_pct`) and coupon codes.

## 1.0.0
- First release.
MD
git add shopcalc/pricing.py CHANGELOG.md
GIT_EDITOR=true git commit -q --no-edit
