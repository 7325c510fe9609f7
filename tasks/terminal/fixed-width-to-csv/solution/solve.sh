#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv
rows = []
with open("/app/report.txt", encoding="utf-8") as f:
    for line in f:
        line = line.rstrip("\n")
        if len(line) < 10 or not line[:10].isdigit():
            continue
        acct, name, branch = line[0:10], line[10:40].strip(), line[40:48].strip()
        bal = line[48:63]
        neg = bal.endswith("-")
        num = bal.rstrip("- ").strip().replace(",", "")
        if neg and num != "0.00":
            num = "-" + num
        d, m, y = line[63:73].split(".")
        rows.append([acct, name, branch, num, f"{y}-{m}-{d}"])
with open("/app/accounts.csv", "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["account", "name", "branch", "balance", "opened"])
    w.writerows(rows)
PY
