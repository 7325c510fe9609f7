#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
import collections, json
from decimal import Decimal
orders = [json.loads(l) for l in open("/app/orders.jsonl") if l.strip()]
status = collections.Counter(o["status"] for o in orders)
cust, skuq = {}, collections.Counter()
for o in orders:
    if o["status"] != "paid":
        continue
    c = cust.setdefault(o["customer"]["id"], {"id": o["customer"]["id"], "name": o["customer"]["name"],
                                             "paid_orders": 0, "revenue": Decimal(0)})
    c["paid_orders"] += 1
    for it in o["items"]:
        c["revenue"] += Decimal(str(it["unit_price"])) * it["qty"]
        skuq[it["sku"]] += it["qty"]
customers = sorted(cust.values(), key=lambda c: (-c["revenue"], c["id"]))
total = sum(c["revenue"] for c in customers)
for c in customers:
    c["revenue"] = float(round(c["revenue"], 2))
top = min(skuq.items(), key=lambda kv: (-kv[1], kv[0]))[0]
json.dump({"orders_by_status": dict(status), "customers": customers,
           "total_revenue": float(round(total, 2)), "top_sku": top},
          open("/app/summary.json", "w"), indent=2)
PY
