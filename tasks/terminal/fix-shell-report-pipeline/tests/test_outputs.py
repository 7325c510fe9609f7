"""Verifier for fix-shell-report-pipeline: runs the script on fresh data sets.

The script runs as a child of this process and owns every file it creates, and what it
leaves running keeps acting between tests: every expected value here is computed from what
the generator returned (in memory) before the script runs, never by reading the inputs
back from disk.
"""

import collections
import importlib.util
import os
import pathlib
import subprocess

SCRIPT = "/app/bin/store_report.sh"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_sales", pathlib.Path(__file__).with_name("gen_sales.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _gen()  # loaded before any test runs the script


def generate(root, seed):
    """Write a data set under ``root``; ``{relative path: text}`` of what was written."""
    return GEN.build(str(root), seed)


def reference(files):
    """The expected report for the data set ``files`` (``{relative path: text}``)."""
    cents, qty, skus = collections.Counter(), collections.Counter(), collections.defaultdict(set)
    for rel, text in files.items():
        if not os.path.basename(rel).endswith(".csv"):
            continue
        lines = text.replace("\r\n", "\n").split("\n")[1:]
        for line in lines:
            if not line:
                continue
            _, store, q, price, sku = line.split(",")
            units, dec = price.split(".")
            cents[store] += int(q) * (int(units) * 100 + int(dec))
            qty[(store, sku)] += int(q)
            skus[store].add(sku)
    rows = []
    for store, c in cents.items():
        top = min(skus[store], key=lambda s: (-qty[(store, s)], s.encode()))
        rows.append((store, c, len(skus[store]), top))
    rows.sort(key=lambda r: (-r[1], r[0].encode()))
    return "store\trevenue\tskus\ttop_sku\n" + "".join(
        f"{s}\t{c // 100}.{c % 100:02d}\t{n}\t{t}\n" for s, c, n, t in rows
    )


def listing(root, files):
    """Every path under ``root`` once ``files`` are written there (files and folders)."""
    paths = set()
    for rel in files:
        parts = pathlib.PurePosixPath(rel).parts
        paths.update(str(pathlib.Path(root, *parts[:i])) for i in range(1, len(parts) + 1))
    return sorted(paths)


def run(indir, out):
    return subprocess.run(["bash", SCRIPT, str(indir), str(out)], capture_output=True, text=True, timeout=60)


def check_seed(tmp_path, seed):
    data = tmp_path / f"in put {seed}"
    expected = reference(generate(data, seed))
    out = tmp_path / "out dir" / "report.tsv"
    out.parent.mkdir()
    r = run(data, out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == expected, f"seed {seed}"


def test_sample_data(tmp_path):
    check_seed(tmp_path, 11)


def test_other_dataset_a(tmp_path):
    check_seed(tmp_path, 12)


def test_other_dataset_b(tmp_path):
    check_seed(tmp_path, 2024)


def test_large_revenues_and_many_files(tmp_path):
    data = tmp_path / "big"
    files = {}
    for k in range(5):
        files.update({f"part {k}/{rel}": text for rel, text in generate(data / f"part {k}", 100 + k).items()})
    expected = reference(files)
    out = tmp_path / "r.tsv"
    r = run(data, out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == expected


def test_rerun_is_idempotent_and_leaves_no_temp_files(tmp_path):
    data = tmp_path / "d"
    files = generate(data, 7)
    expected, expected_data = reference(files), listing(data, files)
    before_tmp = set(os.listdir("/tmp"))
    out = tmp_path / "r.tsv"
    run(data, out)
    first = out.read_text()
    run(data, out)
    assert out.read_text() == first == expected
    assert set(os.listdir("/tmp")) == before_tmp, "temporary files left in /tmp"
    assert sorted(str(p) for p in data.rglob("*")) == expected_data
    assert sorted(os.listdir(tmp_path)) == ["d", "r.tsv"], "stray files next to the output"


def test_empty_input(tmp_path):
    data = tmp_path / "empty"
    data.mkdir()
    (data / "only header.csv").write_text("date,store,qty,price,sku\n")
    out = tmp_path / "r.tsv"
    r = run(data, out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == "store\trevenue\tskus\ttop_sku\n"


def test_missing_directory(tmp_path):
    out = tmp_path / "r.tsv"
    r = run(tmp_path / "does-not-exist", out)
    assert r.returncode == 2
    assert r.stderr.strip() != ""
    assert not out.exists()


def test_tie_breaks(tmp_path):
    data = tmp_path / "ties"
    data.mkdir()
    (data / "a.csv").write_text(
        "date,store,qty,price,sku\n"
        "2024-01-01,Beta,2,5.00,SKU-9\n2024-01-01,Beta,2,5.00,SKU-10\n"
        "2024-01-02,Alpha,1,20.00,SKU-3\n"
        "2024-01-03,Gamma Store,4,0.05,SKU-1\n"
    )
    out = tmp_path / "r.tsv"
    r = run(data, out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == (
        "store\trevenue\tskus\ttop_sku\nAlpha\t20.00\t1\tSKU-3\nBeta\t20.00\t2\tSKU-10\nGamma Store\t0.20\t1\tSKU-1\n"
    )
