"""Verifier for sqlite-schema-migration: applies /app/migrate.sql to fresh legacy databases.

The migration runs in the ``sqlite3`` shell (which runs programs: ``.system``), as a child
of this process that owns the databases it creates, and what it leaves running keeps
acting: the expected tables are computed from the rows the generator returned (in memory),
never from a database read back from disk.
"""

import collections
import importlib.util
import pathlib
import sqlite3
import subprocess
from decimal import Decimal

import pytest

MIGRATION = pathlib.Path("/app/migrate.sql")
SEEDS = [1, 2, 3]

SCHEMA = {  # table -> [(name, type, notnull, pk)]
    "customers": [("id", "INTEGER", 0, 1), ("email", "TEXT", 1, 0), ("name", "TEXT", 1, 0), ("city", "TEXT", 0, 0)],
    "products": [("sku", "TEXT", 0, 1), ("name", "TEXT", 1, 0), ("price_cents", "INTEGER", 1, 0)],
    "orders": [("order_no", "TEXT", 0, 1), ("customer_id", "INTEGER", 1, 0), ("order_date", "TEXT", 1, 0)],
    "order_items": [
        ("order_no", "TEXT", 1, 1),
        ("sku", "TEXT", 1, 2),
        ("qty", "INTEGER", 1, 0),
        ("unit_price_cents", "INTEGER", 1, 0),
    ],
}
FKS = {
    "orders": {("customer_id", "customers", "id")},
    "order_items": {("order_no", "orders", "order_no"), ("sku", "products", "sku")},
}


def _gen():
    spec = importlib.util.spec_from_file_location("gen_legacy", pathlib.Path(__file__).with_name("gen_legacy.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _gen()  # loaded before any migration runs


def cents(text):
    return int((Decimal(text.strip().replace("€", "").replace(",", ".")) * 100).to_integral_value())


def reference(rows):
    latest_c, latest_p, orders, items = {}, {}, {}, collections.OrderedDict()
    for no, date, email, name, city, sku, pname, price, qty in rows:
        email = email.strip().lower()
        key = (date, no)
        if email not in latest_c or key > latest_c[email][0]:
            latest_c[email] = (key, name.strip(), city)
        if sku not in latest_p or key > latest_p[sku][0]:
            latest_p[sku] = (key, pname, cents(price))
        orders[no] = (email, date)
        q, c = items.get((no, sku), (0, cents(price)))
        items[(no, sku)] = (q + qty, c)
    ids = {e: i for i, e in enumerate(sorted(latest_c), 1)}
    return {
        "customers": sorted((ids[e], e, v[1], v[2]) for e, v in latest_c.items()),
        "products": sorted((s, v[1], v[2]) for s, v in latest_p.items()),
        "orders": sorted((no, ids[e], d) for no, (e, d) in orders.items()),
        "order_items": sorted((no, s, q, c) for (no, s), (q, c) in items.items()),
        "order_totals": sorted((no, sum(q * c for (n2, _), (q, c) in items.items() if n2 == no)) for no in orders),
    }


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    assert MIGRATION.is_file(), "missing /app/migrate.sql"
    sql = MIGRATION.read_text()
    out = {}
    for seed in SEEDS:
        db = tmp_path_factory.mktemp(f"m{seed}") / "legacy.db"
        rows = GEN.build(str(db), seed)  # what was written, held here: the expectation's input
        r = subprocess.run(["sqlite3", str(db)], input=sql, capture_output=True, text=True, timeout=60)
        out[seed] = (db, rows, r)
    return out


def _q(db, sql):
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_migration_runs_cleanly(migrated):
    for seed, (_, _, r) in migrated.items():
        assert r.returncode == 0 and "Error" not in r.stderr, f"seed {seed}: {r.stderr}"


def test_schema(migrated):
    for seed, (db, _, _) in migrated.items():
        tables = {
            n for (n,) in _q(db, "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")
        }
        assert tables == set(SCHEMA), f"seed {seed}: {tables}"
        views = {n for (n,) in _q(db, "SELECT name FROM sqlite_master WHERE type='view'")}
        assert views == {"order_totals"}
        for table, cols in SCHEMA.items():
            info = [(r[1], r[2].upper(), r[3], r[5]) for r in _q(db, f"PRAGMA table_info({table})")]
            assert info == cols, (table, info)


def test_constraints(migrated):
    for db, _, _ in migrated.values():
        for table, fks in FKS.items():
            got = {(r[3], r[2], r[4]) for r in _q(db, f"PRAGMA foreign_key_list({table})")}
            assert got == fks, (table, got)
        uniques = [r for r in _q(db, "PRAGMA index_list(customers)") if r[2]]
        cols = [[c[2] for c in _q(db, f"PRAGMA index_info('{r[1]}')")] for r in uniques]
        assert ["email"] in cols, "customers.email must be UNIQUE"
        assert _q(db, "PRAGMA foreign_key_check") == []


def _check_table(migrated, table, sql):
    for seed, (db, rows, _) in migrated.items():
        assert sorted(_q(db, sql)) == reference(rows)[table], f"{table}, seed {seed}"


def test_customers(migrated):
    _check_table(migrated, "customers", "SELECT id, email, name, city FROM customers")


def test_products(migrated):
    _check_table(migrated, "products", "SELECT sku, name, price_cents FROM products")


def test_orders(migrated):
    _check_table(migrated, "orders", "SELECT order_no, customer_id, order_date FROM orders")


def test_order_items(migrated):
    _check_table(migrated, "order_items", "SELECT order_no, sku, qty, unit_price_cents FROM order_items")


def test_order_totals_view(migrated):
    _check_table(migrated, "order_totals", "SELECT order_no, total_cents FROM order_totals")
