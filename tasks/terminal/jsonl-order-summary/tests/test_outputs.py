"""Verifier for jsonl-order-summary. Expected values computed from the pristine export."""

import json
import pathlib

import pytest

OUT = pathlib.Path("/app/summary.json")

EXPECTED_STATUS = {"cancelled": 12, "paid": 184, "pending": 18, "refunded": 26}
EXPECTED_CUSTOMERS = [
    {"id": "C110", "name": "Kavya Rao", "paid_orders": 15, "revenue": 6355.3},
    {"id": "C106", "name": "Goran Petrovic", "paid_orders": 17, "revenue": 5874.37},
    {"id": "C109", "name": "Jonas Berg", "paid_orders": 15, "revenue": 5655.56},
    {"id": "C100", "name": "Ada Byrne", "paid_orders": 14, "revenue": 5432.86},
    {"id": "C108", "name": "Ines Moreau", "paid_orders": 14, "revenue": 4890.92},
    {"id": "C114", "name": "Oona Virtanen", "paid_orders": 11, "revenue": 4752.15},
    {"id": "C112", "name": "Mei Chen", "paid_orders": 10, "revenue": 4490.56},
    {"id": "C104", "name": "Emeka Ude", "paid_orders": 12, "revenue": 4414.19},
    {"id": "C102", "name": "Chidi Okafor", "paid_orders": 15, "revenue": 4378.6},
    {"id": "C113", "name": "Nils Olsen", "paid_orders": 14, "revenue": 4158.02},
    {"id": "C101", "name": "Bo Lindqvist", "paid_orders": 11, "revenue": 3656.33},
    {"id": "C111", "name": "Luca Bianchi", "paid_orders": 7, "revenue": 3522.56},
    {"id": "C107", "name": "Hana Sato", "paid_orders": 9, "revenue": 3143.59},
    {"id": "C105", "name": "Farah Haddad", "paid_orders": 9, "revenue": 3065.22},
    {"id": "C103", "name": "Dana Whitfield", "paid_orders": 11, "revenue": 2387.78},
]
EXPECTED_TOTAL = 66178.01
EXPECTED_TOP_SKU = "SKU-009"


@pytest.fixture(scope="module")
def summary():
    assert OUT.is_file(), f"missing {OUT}"
    return json.loads(OUT.read_text())


def test_top_level_keys(summary):
    assert sorted(summary) == ["customers", "orders_by_status", "top_sku", "total_revenue"]


def test_orders_by_status(summary):
    assert summary["orders_by_status"] == EXPECTED_STATUS


def test_customer_order_and_ids(summary):
    assert [c["id"] for c in summary["customers"]] == [c["id"] for c in EXPECTED_CUSTOMERS]


def test_customer_fields(summary):
    for got, exp in zip(summary["customers"], EXPECTED_CUSTOMERS):
        assert sorted(got) == ["id", "name", "paid_orders", "revenue"]
        assert got["name"] == exp["name"]
        assert got["paid_orders"] == exp["paid_orders"]
        assert isinstance(got["revenue"], (int, float))
        assert abs(got["revenue"] - exp["revenue"]) < 0.006, (got, exp)


def test_total_revenue(summary):
    assert isinstance(summary["total_revenue"], (int, float))
    assert abs(summary["total_revenue"] - EXPECTED_TOTAL) < 0.006


def test_top_sku(summary):
    assert summary["top_sku"] == EXPECTED_TOP_SKU
