#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import json, os, re
S = "/app/snapshot"
procs = {}
for d in os.listdir(S):
    if not d.isdigit():
        continue
    pid = int(d)
    raw = open(f"{S}/{d}/stat").read()
    rest = raw[raw.rindex(")") + 2:].split()        # comm may contain spaces and ')'
    fields = [d, raw[raw.index("(") + 1:raw.rindex(")")]] + rest   # fields[0] is field 1
    status = {}
    for line in open(f"{S}/{d}/status"):
        k, _, v = line.partition(":")
        status[k] = v.strip()
    argv = [a for a in open(f"{S}/{d}/cmdline", "rb").read().decode().split("\0") if a]
    fds = []
    if os.path.isdir(f"{S}/{d}/fd"):
        fds = [os.readlink(f"{S}/{d}/fd/{f}") for f in os.listdir(f"{S}/{d}/fd")]
    procs[pid] = {
        "state": fields[2], "ppid": int(fields[3]), "utime": int(fields[13]), "stime": int(fields[14]),
        "start": int(fields[21]), "name": status["Name"], "uid": int(status["Uid"].split()[0]),
        "rss": int(status["VmRSS"].split()[0]) if "VmRSS" in status else 0, "argv": argv, "fds": fds,
    }
hog = max(procs, key=lambda p: procs[p]["utime"] + procs[p]["stime"])
chain = [hog]
while chain[-1] != 1:
    chain.append(procs[chain[-1]]["ppid"])
inodes = set()
for fn in ("tcp", "tcp6"):
    for line in open(f"{S}/net/{fn}").read().splitlines()[1:]:
        parts = line.split()
        if int(parts[1].rsplit(":", 1)[1], 16) == 8080 and parts[3] == "0A":
            inodes.add(parts[9])
listener = [p for p, v in procs.items() if any(f == f"socket:[{i}]" for i in inodes for f in v["fds"])]
assert len(listener) == 1, listener
zombies = sorted(p for p, v in procs.items() if v["state"] == "Z")
parents = {procs[z]["ppid"] for z in zombies}
assert len(parents) == 1
py = min((p for p, v in procs.items() if v["name"] == "python3"), key=lambda p: procs[p]["start"])
ans = {
    "cpu_hog_pid": hog,
    "cpu_hog_seconds": (procs[hog]["utime"] + procs[hog]["stime"]) / 100,
    "cpu_hog_cmdline": " ".join(procs[hog]["argv"]),
    "cpu_hog_ancestry": chain[::-1],
    "listener_8080_pid": listener[0],
    "zombie_pids": zombies,
    "zombie_parent_name": procs[parents.pop()]["name"],
    "oldest_python3_pid": py,
    "rss_kb_uid_1001": sum(v["rss"] for v in procs.values() if v["uid"] == 1001),
}
json.dump(ans, open("/app/answers.json", "w"), indent=2)
PY
