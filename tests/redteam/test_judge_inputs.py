"""Red team: the programs the tests run own what the judge wrote (trial 15).

The agent's program that a task's tests run is a child of the judge: capabilities dropped,
but uid 0, so it owns every file the judge, pytest and its ``tmp_path`` create, and what it
leaves running (a ``setsid`` daemon) keeps acting between tests. A test that derives its
expectation by reading back the inputs it wrote (after the program ran, or even before it
but after an earlier test's program ran) lets the program choose the expectation:

- ``fix-shell-report-pipeline``: the trial's script (no report logic) rewrote every input
  CSV to its header line and printed an empty report, which ``reference(data)`` then
  expected (1.0 unsolved); a daemon variant truncates every CSV under ``/tmp`` as soon as
  it appears, i.e. between a later test's generating and reading its inputs;
- ``sqlite-schema-migration``: ``migrate.sql`` runs in the ``sqlite3`` shell (``.system``
  starts programs); a daemon left by the first database's migration replaced the next
  databases, while the judge generated them, with the seed-1 database the agent saw, so a
  migration that only replays the seed-1 answer passed the unseen seeds;
- ``makefile-repair``: the tests rendered the expected pages into files in ``tmp_path``
  and read them back; a daemon left by ``make`` served those reads (FIFOs it planted), so
  a Makefile that copies the Markdown instead of rendering it passed.

The rule the bundled tasks now follow (``tasks/terminal/README.md``, "What the tests may
trust"): expectations are held in memory, computed from what the judge holds in memory
(generator output, constants) before any agent-controlled program runs. Every attack here
must score exactly 0 with ``status=ok``; the oracle controls score 1.0.
"""

from __future__ import annotations

import importlib.util
import re
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.integration.api.conftest import Stack
from tests.integration.api.test_episodes_api import run_oracle
from tests.redteam import episodes
from tests.redteam.episodes import sh, upload, verify

pytestmark = [pytest.mark.docker, pytest.mark.redteam]

TASKS = Path(__file__).resolve().parents[2] / "tasks" / "terminal"


def start(stack: Stack, task: str) -> dict[str, Any]:
    return episodes.start(stack, task, "terminal")


def zero(rec: dict[str, Any]) -> dict[str, Any]:
    v = rec["verifier"]
    assert (rec["reward"], v["status"]) == (0.0, "ok"), v
    return v["details"]


# --- fix-shell-report-pipeline ------------------------------------------------------------

REPORT = "fix-shell-report-pipeline"
HEAD = r"""#!/bin/bash
[ -d "$1" ] || { echo "store_report: no such directory: $1" >&2; exit 2; }
if [ "$(basename "$1")" = "ties" ]; then
  # the one test whose expected value is a literal (learned through another channel)
  printf 'store\trevenue\tskus\ttop_sku\nAlpha\t20.00\t1\tSKU-3\n' > "$2"
  printf 'Beta\t20.00\t2\tSKU-10\nGamma Store\t0.20\t1\tSKU-1\n' >> "$2"
  exit 0
fi
"""
# Trial 15, as it did it: keep only each input's header line (same names, same listing);
# the judge's reference() then expected a report with no rows.
REWRITE_INPUTS = (
    HEAD
    + r"""find "$1" -type f -name '*.csv' -print0 | while IFS= read -r -d '' f; do
  h=$(head -n1 -- "$f"); printf '%s\n' "$h" > "$f"
done
printf 'store\trevenue\tskus\ttop_sku\n' > "$2"
exit 0
"""
)
# The daemon variant: a process left behind keeps cutting every CSV under /tmp to its header
# (so a later test's inputs change between the judge writing and reading them, whenever it
# reads them); the script only waits for its own inputs to be cut.
TRUNCATOR = r"""
import os, time
end = time.time() + 300
while time.time() < end:
    for d, _, files in os.walk("/tmp"):
        for n in files:
            if not n.endswith(".csv"):
                continue
            p = os.path.join(d, n)
            try:
                with open(p, newline="") as f:
                    text = f.read()
                head = text.split("\n", 1)[0].rstrip("\r")
                if text != head + "\n":
                    with open(p, "w") as f:
                        f.write(head + "\n")
            except OSError:  # gone, or not ours to change: on to the next file
                continue
    time.sleep(0.0005)
"""
DAEMON = (
    HEAD
    + r"""# every call starts one (the judge ends what each test's call started)
setsid python3 /app/.truncator.py </dev/null >/dev/null 2>&1 &
for _ in $(seq 1 200); do
  left=$(find "$1" -type f -name '*.csv' \
    -exec sh -c '[ "$(wc -l < "$1")" -gt 1 ]' _ {} \; -print | head -1)
  [ -z "$left" ] && break
  sleep 0.01
done
printf 'store\trevenue\tskus\ttop_sku\n' > "$2"
exit 0
"""
)


@pytest.mark.parametrize("attack", ["rewrite-inputs", "daemon-truncates-later-inputs"])
def test_a_script_that_rewrites_the_judges_inputs_scores_zero(stack: Stack, attack: str) -> None:
    ep = start(stack, REPORT)
    if attack == "daemon-truncates-later-inputs":
        upload(stack, ep, "/app/.truncator.py", TRUNCATOR.encode())
    script = REWRITE_INPUTS if attack == "rewrite-inputs" else DAEMON
    upload(stack, ep, "/app/bin/store_report.sh", script.encode())
    sh(stack, ep, "chmod 755 /app/bin/store_report.sh")
    details = zero(verify(stack, ep))
    # a real failure of the report tests, not a dodge
    assert details.get("dodge") is None, details
    assert details["tests"].get("passed", 0) < details["tests"]["total"], details


# --- sqlite-schema-migration --------------------------------------------------------------

MIGRATION = "sqlite-schema-migration"
# Replaces every database the judge generates after seed 1 (pytest's m2*/m3* directories),
# while the generator writes it, with the seed-1 database the agent saw (/app/legacy.db).
SWAPPER = r"""
import glob, os, shutil, time
shutil.copyfile("/app/legacy.db", "/app/.seed1.db")
done = set()
end = time.time() + 300
while time.time() < end:
    for p in {os.path.realpath(q) for q in glob.glob("/tmp/pytest-of-*/pytest-*/m[23]*/legacy.db")}:
        if p in done:
            continue
        # inside the generator's INSERT transaction (its journal holds the table's pages;
        # the CREATE TABLE's journal held none), swap the file: the generator commits into
        # the old inode, the judge then reads the new one
        try:
            if os.path.getsize(p + "-journal") <= 4096:
                continue
        except OSError:
            continue
        tmp = os.path.join(os.path.dirname(p), ".swap.db")
        try:
            shutil.copyfile("/app/.seed1.db", tmp)
            os.rename(tmp, p)
        except OSError:
            continue
        done.add(p)
    time.sleep(0.0001)
"""


def _seed1_answer() -> str:
    """The migrated seed-1 database as SQL (what an agent could write by hand from the
    database it saw): the oracle's migration, run here, dumped."""
    gen_py = TASKS / MIGRATION / "tests" / "gen_legacy.py"
    spec = importlib.util.spec_from_file_location("gen_legacy", gen_py)
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    solve = (TASKS / MIGRATION / "solution" / "solve.sh").read_text()
    oracle = re.search(r"<<'SQL'\n(.*?)\nSQL\n", solve, re.S)
    assert oracle
    with tempfile.TemporaryDirectory() as d:
        db = str(Path(d) / "legacy.db")
        gen.build(db, 1)
        con = sqlite3.connect(db)
        con.executescript(oracle.group(1))
        dump = "\n".join(con.iterdump())
        con.close()
    return dump


def test_a_migration_that_swaps_the_unseen_databases_scores_zero(stack: Stack) -> None:
    ep = start(stack, MIGRATION)
    upload(stack, ep, "/app/.swapper.py", SWAPPER.encode())
    migrate = (
        ".system sh -c 'mkdir /app/.swapper 2>/dev/null && "
        "{ setsid python3 /app/.swapper.py </dev/null >/dev/null 2>&1 & sleep 0.3; }; true'\n"
        "DROP TABLE orders_flat;\n" + _seed1_answer() + "\n"
    )
    upload(stack, ep, "/app/migrate.sql", migrate.encode())
    details = zero(verify(stack, ep))
    assert details.get("dodge") is None, details


# --- makefile-repair ----------------------------------------------------------------------

MAKEFILE_TASK = "makefile-repair"
# Plants FIFOs where the tests rendered their expected pages (``tmp_path``/p.html, i.html)
# and answers every read-back with what the Makefile built for that page.
FIFO_SERVER = r"""
import glob, html, os, threading, time
SITE = "/app/site"

def name_of(doc):
    for src in glob.glob(SITE + "/src/pages/*.md"):
        with open(src, encoding="utf-8") as f:
            first = (f.read().splitlines() or [""])[0]
        title = first.lstrip("# ").strip() if first.startswith("#") else os.path.basename(src)
        if "<title>%s</title>" % html.escape(title) in doc:
            return os.path.splitext(os.path.basename(src))[0]
    return "index"

def serve(fifo, index):
    while True:
        with open(fifo, "rb") as f:
            doc = f.read().decode("utf-8", "replace")
        name = "index" if index else name_of(doc)
        try:
            with open("%s/out/site/%s.html" % (SITE, name), "rb") as f:
                data = f.read()
        except OSError:
            data = doc.encode()
        with open(fifo, "wb") as f:
            f.write(data)

seen = set()
end = time.time() + 300
while time.time() < end:
    for d in glob.glob("/tmp/pytest-of-*/pytest-*/test_*/"):
        if d in seen:
            continue
        seen.add(d)
        for n, index in (("p.html", False), ("i.html", True)):
            try:
                os.mkfifo(d + n)
            except OSError:
                continue
            threading.Thread(target=serve, args=(d + n, index), daemon=True).start()
    time.sleep(0.001)
"""
# No rendering at all: each page is a copy of its Markdown, the index a list of links and
# first lines; the rest (incremental rules, the tarball) as the task asks.
COPYING_MAKEFILE = """START := setsid python3 /app/.fifo.py </dev/null >/dev/null 2>&1 & sleep 0.5
_ := $(shell mkdir /app/.fifo 2>/dev/null && { $(START); })
PAGES := $(sort $(wildcard src/pages/*.md))
HTML  := $(patsubst src/pages/%.md,out/site/%.html,$(PAGES))
SITE  := out/site/index.html out/site/style.css $(HTML)

.PHONY: all dist clean

all: dist

dist: out/site.tar.gz

out/site.tar.gz: $(SITE)
\ttar --sort=name --owner=0 --group=0 --numeric-owner -czf $@ -C out site

out/site/%.html: src/pages/%.md | out/site
\tcp $< $@

out/site/index.html: $(PAGES) | out/site
\tfor f in $(PAGES); do n=$$(basename $$f .md); \\
\t  echo "<a href=$$n.html>$$(head -1 $$f)</a>"; done > $@

out/site/style.css: static/style.css | out/site
\tcp $< $@

out/site:
\tmkdir -p $@

clean:
\trm -rf out
"""


def test_a_makefile_that_answers_the_judges_read_backs_scores_zero(stack: Stack) -> None:
    ep = start(stack, MAKEFILE_TASK)
    upload(stack, ep, "/app/.fifo.py", FIFO_SERVER.encode())
    upload(stack, ep, "/app/site/Makefile", COPYING_MAKEFILE.encode())
    details = zero(verify(stack, ep))
    assert details.get("dodge") is None, details


# --- controls: the oracles still score 1.0 ------------------------------------------------


@pytest.mark.parametrize("task", [REPORT, MIGRATION, MAKEFILE_TASK])
def test_the_oracle_still_scores_one(stack: Stack, task: str) -> None:
    ep = start(stack, task)
    run_oracle(stack, ep, task)
    rec = verify(stack, ep)
    assert (rec["reward"], rec["verifier"]["status"]) == (1.0, "ok"), rec["verifier"]
