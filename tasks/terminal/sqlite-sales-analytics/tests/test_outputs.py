"""Verifier for sqlite-sales-analytics.

The agent's queries are run (read-only) against freshly generated databases: the one the
agent saw (seed 1) and two unseen ones (seeds 2 and 3), and compared with an independent
Python computation. The facts that computation needs are read from each database as soon
as it is generated, before any of the agent's queries runs, and held in memory.
"""

import collections
import importlib.util
import pathlib
import sqlite3

import pytest

QUERIES = pathlib.Path("/app/queries")
SEEDS = [1, 2, 3]
NAMES = ["q1_top_customers.sql", "q2_monthly_revenue.sql", "q3_unsold_products.sql", "q4_repeat_rate.sql"]


def _load_gen():
    spec = importlib.util.spec_from_file_location("gen_shop", pathlib.Path(__file__).with_name("gen_shop.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    gen = _load_gen()
    out = {}
    for seed in SEEDS:
        p = tmp_path_factory.mktemp(f"db{seed}") / "shop.db"
        gen.build(str(p), seed)
        out[seed] = (p, _facts(p))  # before any query of the agent's runs
    return out


def _run(db, name):
    path = QUERIES / name
    assert path.is_file(), f"missing {path}"
    sql = path.read_text().strip()
    while sql.endswith(";"):
        sql = sql[:-1].rstrip()
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        cur = con.execute(sql)
        cols = [d[0] for d in cur.description]
        return cols, [tuple(r) for r in cur.fetchall()]
    finally:
        con.close()


def _facts(db):
    con = sqlite3.connect(str(db))
    names = dict(con.execute("SELECT customer_id, name FROM customers"))
    products = con.execute("SELECT product_id, name FROM products ORDER BY product_id").fetchall()
    orders = {
        oid: (cid, ts)
        for oid, cid, ts in con.execute("SELECT order_id, customer_id, ordered_at FROM orders WHERE status='completed'")
    }
    value = collections.defaultdict(float)
    sold = set()
    for oid, pid, qty, price in con.execute("SELECT order_id, product_id, qty, unit_price FROM order_items"):
        if oid in orders:
            value[oid] += qty * price
            sold.add(pid)
    con.close()
    return names, products, orders, value, sold


def _close(a, b):
    return abs(float(a) - float(b)) <= 0.0051


def test_query_files_exist():
    for n in NAMES:
        assert (QUERIES / n).is_file(), n


def test_q1_top_customers(dbs):
    for seed, (db, facts) in dbs.items():
        names, _, orders, value, _ = facts
        spent = collections.defaultdict(float)
        for oid, (cid, _) in orders.items():
            spent[cid] += value[oid]
        exp = sorted(spent.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        cols, rows = _run(db, NAMES[0])
        assert cols == ["customer_id", "name", "total_spent"], cols
        assert [(r[0], r[1]) for r in rows] == [(c, names[c]) for c, _ in exp], f"seed {seed}"
        assert all(_close(r[2], v) for r, (_, v) in zip(rows, exp)), f"seed {seed}"


def test_q2_monthly_revenue(dbs):
    for seed, (db, facts) in dbs.items():
        _, _, orders, value, _ = facts
        months = collections.defaultdict(lambda: [0, 0.0])
        for oid, (_, ts) in orders.items():
            months[ts[:7]][0] += 1
            months[ts[:7]][1] += value[oid]
        exp = sorted(months.items())
        cols, rows = _run(db, NAMES[1])
        assert cols == ["month", "orders", "revenue"], cols
        assert [(r[0], r[1]) for r in rows] == [(m, v[0]) for m, v in exp], f"seed {seed}"
        assert all(_close(r[2], v[1]) for r, (_, v) in zip(rows, exp)), f"seed {seed}"


def test_q3_unsold_products(dbs):
    for seed, (db, facts) in dbs.items():
        _, products, _, _, sold = facts
        exp = [(pid, name) for pid, name in products if pid not in sold]
        cols, rows = _run(db, NAMES[2])
        assert cols == ["product_id", "name"], cols
        assert rows == exp, f"seed {seed}"


def test_q4_repeat_rate(dbs):
    for seed, (db, facts) in dbs.items():
        _, _, orders, _, _ = facts
        per = collections.Counter(cid for cid, _ in orders.values())
        buyers = len(per)
        repeat = sum(1 for k in per.values() if k >= 2)
        cols, rows = _run(db, NAMES[3])
        assert cols == ["buyers", "repeat_buyers", "repeat_rate"], cols
        assert len(rows) == 1
        assert rows[0][0] == buyers and rows[0][1] == repeat, f"seed {seed}"
        assert isinstance(rows[0][2], float)
        assert abs(rows[0][2] - round(repeat / buyers, 4)) < 1e-9, f"seed {seed}"
