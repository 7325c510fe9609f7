#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv, datetime, json
with open("/app/bank.csv", encoding="iso-8859-1", newline="") as f:
    rows = list(csv.reader(f, delimiter=";"))
bank = []
for line_no, (day, desc, amount) in enumerate(rows[1:], start=2):
    d, m, y = map(int, day.split("."))
    neg = amount.startswith("-")
    units, cents = amount.lstrip("-").replace(".", "").split(",")
    value = int(units) * 100 + int(cents)
    bank.append({"line": line_no, "date": datetime.date(y, m, d), "desc": desc, "amount": -value if neg else value})
entries = json.load(open("/app/ledger.json", encoding="utf-8"))["entries"]
used, matched, unmatched = set(), [], []
for e in sorted(entries, key=lambda e: (e["date"], e["id"])):
    day = datetime.date.fromisoformat(e["date"])
    cands = [b for b in bank if b["line"] not in used and b["amount"] == e["amount_cents"]
             and abs((b["date"] - day).days) <= 3]
    if not cands:
        unmatched.append(e["id"])
        continue
    best = min(cands, key=lambda b: (0 if e["ref"] and e["ref"] in b["desc"] else 1,
                                     abs((b["date"] - day).days), b["line"]))
    used.add(best["line"])
    matched.append([e["id"], best["line"]])
bank_total = sum(b["amount"] for b in bank)
ledger_total = sum(e["amount_cents"] for e in entries)
json.dump({"matched": sorted(matched), "unmatched_ledger": sorted(unmatched),
           "unmatched_bank": sorted(b["line"] for b in bank if b["line"] not in used),
           "bank_balance_cents": bank_total, "ledger_balance_cents": ledger_total,
           "difference_cents": bank_total - ledger_total},
          open("/app/reconciliation.json", "w"), indent=2)
PY
