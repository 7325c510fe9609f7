"""Verifier for makefile-repair.

``make`` runs the agent's Makefile as a child of this process, which owns every file this
process creates, and what it leaves running keeps acting between tests: the expected site
is rendered in memory from the sources as they were before any ``make`` ran (and the pages
the tests write), never from files read back after a build.
"""

import hashlib
import importlib.util
import os
import pathlib
import subprocess
import tarfile
import time

SITE = pathlib.Path("/app/site")
OUT = SITE / "out"
PRISTINE = {
    "clean": "0a34b5a34a5c6ed956c6b193777bff2f6ca3099735a8bb216f335d493a3c6d87",
    "dist": "cd84147060f7b99cc3e9feac8d875df77ac1410a916641a649adc4bf7d9b3afc",
    "src/pages/about.md": "fe11dde9fa8bc7bcbbaa027f28ad5ac8b018d85e7c17a82882f67048155bfcf1",
    "src/pages/birds.md": "245ab32a2b58d150b1126e31f007f103b450914dc68bff35589eb401e3166df2",
    "src/pages/tides.md": "c25c0be98023e5ebfdabb48f0c4b39875dcebabe774f45a73f433689508158fe",
    "static/style.css": "3a454a73611411adbb0484dd04d58cfaa3556b55c8a529aa0641a0fb17102e7f",
    "tools/render.py": "2ad5cd6d7853987313bbf7209a9f3d187b06aa41ebb4d8f8dd02f18bd17d6f74",
}


def _renderer():
    spec = importlib.util.spec_from_file_location(
        "render_pristine", pathlib.Path(__file__).with_name("render_pristine.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RENDER = _renderer()


def _read_text(path):
    with open(path, encoding="utf-8") as f:  # as the renderer reads it
        return f.read()


# The sources before any make ran (test_project_files_untouched pins them): {name: text}
PAGES = {p.stem: _read_text(p) for p in sorted((SITE / "src/pages").glob("*.md"))}
STYLE = (SITE / "static/style.css").read_bytes()


def make(*args, check=True):
    r = subprocess.run(["make", *args], cwd=SITE, capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, f"make {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


def fresh_build():
    make("clean")
    assert not OUT.exists(), "make clean must remove out/"
    make()


def expected_files(pages):
    """The site the renderer makes from ``pages`` ({name: Markdown text}): {file name: bytes}."""
    srcs = {str(SITE / f"src/pages/{name}.md"): text for name, text in pages.items()}
    exp = {f"{pathlib.Path(src).stem}.html": RENDER.page_html(src, text).encode() for src, text in srcs.items()}
    exp["index.html"] = RENDER.index_html(list(srcs), srcs).encode()
    exp["style.css"] = STYLE
    return exp


def check_outputs(pages=PAGES):
    exp = expected_files(pages)
    got = {p.name: p.read_bytes() for p in (OUT / "site").iterdir() if p.is_file()}
    assert sorted(got) == sorted(exp)
    for k in exp:
        assert got[k] == exp[k], f"out/site/{k} has unexpected content"
    with tarfile.open(OUT / "site.tar.gz", "r:gz") as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
        names = [m.name for m in t.getmembers()]
    assert all(n == "site" or n.startswith("site/") for n in names), names
    assert files == {f"site/{k}": v for k, v in exp.items()}


def backdate():
    """Make sources older than outputs, deterministically; the outputs' times set ({path: ns})."""
    now = int(time.time()) * 10**9
    outputs = {}
    for p in list(SITE.rglob("*")):
        if p.is_file():
            t = now - 100 * 10**9 if OUT in p.parents else now - 200 * 10**9
            os.utime(p, ns=(t, t))
            if OUT in p.parents:
                outputs[p] = t
    return outputs


def test_project_files_untouched():
    for rel, digest in PRISTINE.items():
        assert hashlib.sha256((SITE / rel).read_bytes()).hexdigest() == digest, rel


def test_clean_then_full_build():
    fresh_build()
    check_outputs()


def test_second_make_is_noop():
    fresh_build()
    before = backdate()
    assert make("-q", check=False).returncode == 0, "make -q says the build is not up to date"
    make()
    after = {p: p.stat().st_mtime_ns for p in OUT.rglob("*") if p.is_file()}
    assert before == after, "a second make rebuilt files"


def test_edit_one_page_rebuilds_only_what_depends_on_it():
    fresh_build()
    times = backdate()
    untouched = [OUT / "site/about.html", OUT / "site/tides.html", OUT / "site/style.css"]
    before = {p: times.get(p) for p in untouched}
    edited = "# Bird Counts (Autumn)\n\nAutumn counts recorded 37 species.\n"
    (SITE / "src/pages/birds.md").write_text(edited)
    try:
        make()
        assert {p: p.stat().st_mtime_ns for p in untouched} == before, "unrelated files were rebuilt"
        assert "Autumn counts" in (OUT / "site/birds.html").read_text()
        assert "Bird Counts (Autumn)" in (OUT / "site/index.html").read_text()
        check_outputs(dict(PAGES, birds=edited))
    finally:
        (SITE / "src/pages/birds.md").write_text(
            "# Bird Counts\n\nSpring counts recorded 41 species, including <rare> avocets.\n"
        )


def test_new_page_is_picked_up():
    fresh_build()
    backdate()
    new = SITE / "src/pages/moths.md"
    text = "# Moth Trap\n\nThe trap runs on warm nights.\n"
    new.write_text(text)
    try:
        make()
        assert (OUT / "site/moths.html").is_file()
        assert "moths.html" in (OUT / "site/index.html").read_text()
        check_outputs(dict(PAGES, moths=text))
    finally:
        new.unlink()


def test_dist_target_from_clean():
    make("clean")
    make("dist")
    check_outputs()
    assert (SITE / "dist").read_text() == "old release notes (do not delete)\n"
    assert (SITE / "clean").read_text() == "notes from the 2019 cleanup script (do not delete)\n"
