"""Verifier for fix-shell-report-pipeline: runs the script on fresh data sets."""

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


def reference(root):
    cents, qty, skus = collections.Counter(), collections.Counter(), collections.defaultdict(set)
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".csv"):
                continue
            with open(os.path.join(dirpath, name), newline="") as f:
                lines = f.read().replace("\r\n", "\n").split("\n")[1:]
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


def run(indir, out):
    return subprocess.run(["bash", SCRIPT, str(indir), str(out)], capture_output=True, text=True, timeout=60)


def check_seed(tmp_path, seed):
    data = tmp_path / f"in put {seed}"
    _gen().build(str(data), seed)
    out = tmp_path / "out dir" / "report.tsv"
    out.parent.mkdir()
    r = run(data, out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == reference(data), f"seed {seed}"


def test_sample_data(tmp_path):
    check_seed(tmp_path, 11)


def test_other_dataset_a(tmp_path):
    check_seed(tmp_path, 12)


def test_other_dataset_b(tmp_path):
    check_seed(tmp_path, 2024)


def test_large_revenues_and_many_files(tmp_path):
    data = tmp_path / "big"
    for k in range(5):
        _gen().build(str(data / f"part {k}"), 100 + k)
    out = tmp_path / "r.tsv"
    r = run(data, out)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == reference(data)


def test_rerun_is_idempotent_and_leaves_no_temp_files(tmp_path):
    data = tmp_path / "d"
    _gen().build(str(data), 7)
    before_tmp = set(os.listdir("/tmp"))
    before_data = sorted(str(p) for p in data.rglob("*"))
    out = tmp_path / "r.tsv"
    run(data, out)
    first = out.read_text()
    run(data, out)
    assert out.read_text() == first == reference(data)
    assert set(os.listdir("/tmp")) == before_tmp, "temporary files left in /tmp"
    assert sorted(str(p) for p in data.rglob("*")) == before_data
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
