#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv, datetime, json, re
rows = list(csv.DictReader(open("/app/customers_raw.csv", newline="", encoding="utf-8")))
codes = {}
for r in csv.DictReader(open("/app/country_codes.csv", newline="", encoding="utf-8")):
    codes[r["name"].strip().lower()] = r["code"].strip().upper()
    codes[r["code"].strip().lower()] = r["code"].strip().upper()
MONTHS = {m: i + 1 for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split())}

def parse_date(s):
    s = s.strip()
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", s):
        return datetime.date.fromisoformat(s)
    if re.fullmatch(r"\d{8}", s):
        return datetime.date(int(s[:4]), int(s[4:6]), int(s[6:]))
    m = re.fullmatch(r"(\d{1,2})/(\d{1,2})/(\d{4})", s)
    if m:
        return datetime.date(int(m[3]), int(m[2]), int(m[1]))
    m = re.fullmatch(r"([A-Za-z]{3}) (\d{1,2}) (\d{4})", s)
    return datetime.date(int(m[3]), MONTHS[m[1].title()], int(m[2]))

def norm_phone(s):
    s = s.strip()
    if s.startswith("00"):
        s = "+" + s[2:]
    return "+" + re.sub(r"\D", "", s)

best, invalid = {}, 0
for r in rows:
    email = r["email"].strip().lower()
    if "@" not in email:
        invalid += 1
        continue
    rec = {"customer_id": r["customer_id"].strip(), "name": " ".join(r["name"].split()),
           "email": email, "phone": norm_phone(r["phone"]),
           "country": codes[r["country"].strip().lower()],
           "signup_date": parse_date(r["signup_date"]).isoformat()}
    key = (rec["signup_date"], int(rec["customer_id"]))
    cur = best.get(email)
    if cur is None or key < (cur["signup_date"], int(cur["customer_id"])):
        best[email] = rec
out = sorted(best.values(), key=lambda r: int(r["customer_id"]))
with open("/app/customers_clean.csv", "w", newline="", encoding="utf-8") as f:
    w = csv.DictWriter(f, fieldnames=["customer_id", "name", "email", "phone", "country", "signup_date"],
                       lineterminator="\n")
    w.writeheader()
    w.writerows(out)
json.dump({"input_rows": len(rows), "invalid_email": invalid,
           "duplicates_removed": len(rows) - invalid - len(out), "output_rows": len(out)},
          open("/app/cleanup_stats.json", "w"))
PY
