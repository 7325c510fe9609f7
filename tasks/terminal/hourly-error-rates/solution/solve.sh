#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import collections, datetime, gzip, json, pathlib
total, errors, bad = collections.Counter(), collections.Counter(), 0
for p in sorted(pathlib.Path("/app/logs").iterdir()):
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
                ts = datetime.datetime.fromisoformat(ev["ts"].replace("Z", "+00:00"))
                if ts.tzinfo is None:
                    raise ValueError("naive timestamp")
            except Exception:
                bad += 1
                continue
            hour = ts.astimezone(datetime.timezone.utc).replace(minute=0, second=0, microsecond=0)
            total[hour] += 1
            status = ev.get("status")
            if ev.get("level") == "ERROR" or (isinstance(status, int) and status >= 500):
                errors[hour] += 1
with open("/app/error_rates.csv", "w") as out:
    out.write("hour,total,errors,error_rate\n")
    h, last = min(total), max(total)
    while h <= last:
        t, e = total[h], errors[h]
        out.write(f"{h:%Y-%m-%dT%H:00Z},{t},{e},{(e / t if t else 0):.4f}\n")
        h += datetime.timedelta(hours=1)
pathlib.Path("/app/malformed.txt").write_text(f"{bad}\n")
PY
