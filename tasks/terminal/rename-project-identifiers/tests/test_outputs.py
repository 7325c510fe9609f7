"""Verifier for rename-project-identifiers."""

import hashlib
import os
import pathlib
import re
import subprocess

ROOT = pathlib.Path("/app/project")

EXPECTED = {
    "LICENSE": "62f494f66514246096a8af7fc780b7ae87387bff253aeb5f45d2394f7b041abd",
    "README.md": "fa87f4281b28ae7f7d9d5237baaeb26e1cbdf3214c4d58469d879193e990b916",
    "assets/nova_gadgets_logo.png": "abf8d70ebb1ba2fa285144af4bd8866714e71aacc61f525f7a02e46a8a135976",
    "docs/nova_gadgets_guide.md": "e853961c4f15e17ddc09bbd42951f54d1a131367c259c2add9c2c8d360776ca0",
    "scripts/release.sh": "a6c949b60cb84428badf75d784ad2b16ad7d61a4ff3d27e033df2d05f34e628c",
    "setup.cfg": "a95dbaced1b591b377c2f5df7888699b9e5e7d664b3bc704829d59f3805a443f",
    "src/nova_gadgets/__init__.py": "5f6423560fd77c2840467d5d907c34b51c2163c9d41386d80c6e7516f14677af",
    "src/nova_gadgets/nova_gadgets_cli.py": "f0678a1cfab0bf64906ecb740fdf8c6f450c6d46322309bb757b653ed3fb80aa",
    "src/nova_gadgets/core.py": "819288fbab01694cb1514b14e7e5071fff19c6a02d7db69511c47b8a2585eb2b",
    "tests/test_core.py": "230e00515a19819a9a0350dfa9b6b7eae5ccf5cb209085dd6f6751c8321ede20",
    "vendor/legacy/client.py": "f6cf7cebe27fe33017963b0879d955b25402671abe054d0fa720da67eab1a1be",
}
OLD = re.compile(r"acme_widgets|acme-widgets|AcmeWidgets|ACME_WIDGETS")


def _files():
    out = set()
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if "__pycache__" in rel.parts or ".pytest_cache" in rel.parts:
            continue
        if p.is_file():
            out.add(str(rel))
    return out


def test_no_old_names_outside_vendor():
    for p in ROOT.rglob("*"):
        rel = str(p.relative_to(ROOT))
        if rel.startswith("vendor"):
            continue
        assert not OLD.search(rel), rel


def test_no_old_identifiers_in_text_outside_vendor():
    for rel in _files():
        if rel.startswith("vendor/") or rel.endswith(".png"):
            continue
        assert not OLD.search((ROOT / rel).read_text()), rel


def test_file_set():
    assert _files() == set(EXPECTED)


def test_exact_contents():
    for rel, digest in EXPECTED.items():
        assert hashlib.sha256((ROOT / rel).read_bytes()).hexdigest() == digest, rel


def test_script_still_executable():
    assert os.access(ROOT / "scripts/release.sh", os.X_OK)


def test_project_tests_pass():
    env = dict(os.environ, PYTHONPATH="src", PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run(
        ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_renamed_package_behaviour():
    code = (
        "import nova_gadgets as n; inv = n.NovaGadgets().add(n.Widget('x', 5, 3)); "
        "assert inv.total_value_cents() == 15; "
        "assert inv.describe() == 'NovaGadgets(1 skus) via nova-gadgets/2.3.1'; "
        "assert n.NOVA_GADGETS_VERSION == '2.3.1'"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run(["python3", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
