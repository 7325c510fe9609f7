#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import datetime, json, re

MONTHS = {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}
DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
          "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}

def value(tok, names):
    tok = tok.lower()
    return names[tok] if names and tok in names else int(tok)

def field(text, lo, hi, names=None):
    out = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, s = part.split("/")
            step = int(s)
        if part == "*":
            a, b = lo, hi
        elif "-" in part:
            a, b = (value(x, names) for x in part.split("-"))
        else:
            a = value(part, names)
            b = hi if step != 1 else a
        out.update(range(a, b + 1, step))
    return out

def schedule(spec, after, n=5):
    m, h, dom, mon, dow = spec.split()
    mins, hours = sorted(field(m, 0, 59)), sorted(field(h, 0, 23))
    doms, months = field(dom, 1, 31), field(mon, 1, 12, MONTHS)
    dows = field(dow, 0, 7, DAYS)
    if 7 in dows:
        dows = (dows - {7}) | {0}
    star = dom.startswith("*") or dow.startswith("*")
    start = after + datetime.timedelta(minutes=1)
    day, res = start.date(), []
    while len(res) < n:
        in_dom, in_dow = day.day in doms, day.isoweekday() % 7 in dows
        if day.month in months and ((in_dom and in_dow) if star else (in_dom or in_dow)):
            for hh in hours:
                for mm in mins:
                    t = datetime.datetime(day.year, day.month, day.day, hh, mm)
                    if t >= start and len(res) < n:
                        res.append(t.strftime("%Y-%m-%dT%H:%M"))
        day += datetime.timedelta(days=1)
    return res

ref = datetime.datetime(2024, 2, 27, 23, 59)
jobs = []
with open("/app/crontab") as f:
    for no, line in enumerate(f, 1):
        s = line.strip()
        if not s or s.startswith("#") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*\s*=", s):
            continue
        if s.startswith("@"):
            macro, cmd = s.split(None, 1)
            if macro == "@reboot":
                continue
            spec = MACROS[macro]
        else:
            parts = s.split(None, 5)
            spec, cmd = " ".join(parts[:5]), parts[5]
        jobs.append({"line": no, "command": cmd.strip(), "next": schedule(spec, ref)})
json.dump(jobs, open("/app/schedule.json", "w"), indent=2)
PY
