"""Verifier for bank-ledger-reconcile (expected result computed from the pristine exports)."""

import json
import pathlib

import pytest

OUT = pathlib.Path("/app/reconciliation.json")
EXPECTED_MATCHED = [
    ["L1003", 64],
    ["L1004", 41],
    ["L1006", 69],
    ["L1010", 66],
    ["L1011", 16],
    ["L1013", 10],
    ["L1016", 13],
    ["L1021", 58],
    ["L1025", 59],
    ["L1028", 50],
    ["L1033", 22],
    ["L1035", 30],
    ["L1036", 3],
    ["L1039", 23],
    ["L1042", 51],
    ["L1045", 74],
    ["L1049", 54],
    ["L1051", 2],
    ["L1052", 39],
    ["L1053", 27],
    ["L1054", 46],
    ["L1056", 32],
    ["L1060", 57],
    ["L1063", 28],
    ["L1066", 63],
    ["L1067", 4],
    ["L1069", 45],
    ["L1070", 75],
    ["L1072", 60],
    ["L1075", 7],
    ["L1078", 72],
    ["L1081", 24],
    ["L1084", 35],
    ["L1088", 55],
    ["L1089", 19],
    ["L1091", 33],
    ["L1096", 25],
    ["L1098", 73],
    ["L1100", 76],
    ["L1103", 49],
    ["L1104", 18],
    ["L1107", 71],
    ["L1110", 52],
    ["L1115", 65],
    ["L1118", 26],
    ["L1121", 11],
    ["L1131", 67],
    ["L1134", 61],
    ["L1136", 20],
    ["L1138", 43],
    ["L1139", 62],
    ["L1143", 42],
    ["L1144", 8],
    ["L1147", 21],
    ["L1151", 17],
    ["L1152", 15],
    ["L1153", 40],
    ["L1154", 37],
    ["L1155", 36],
    ["L1156", 34],
    ["L1157", 14],
    ["L1158", 12],
    ["L1159", 44],
]
EXPECTED_UNMATCHED_LEDGER = [
    "L1009",
    "L1019",
    "L1022",
    "L1030",
    "L1047",
    "L1055",
    "L1058",
    "L1087",
    "L1094",
    "L1113",
    "L1124",
    "L1126",
    "L1129",
    "L1137",
    "L1140",
    "L1150",
]
EXPECTED_UNMATCHED_BANK = [5, 6, 9, 29, 31, 38, 47, 48, 53, 56, 68, 70, 77]
EXPECTED_BANK = 1982667
EXPECTED_LEDGER = 545645


@pytest.fixture(scope="module")
def rec():
    assert OUT.is_file(), "missing /app/reconciliation.json"
    return json.loads(OUT.read_text())


def test_keys(rec):
    assert sorted(rec) == sorted(
        [
            "matched",
            "unmatched_ledger",
            "unmatched_bank",
            "bank_balance_cents",
            "ledger_balance_cents",
            "difference_cents",
        ]
    )


def test_balances(rec):
    assert rec["bank_balance_cents"] == EXPECTED_BANK
    assert rec["ledger_balance_cents"] == EXPECTED_LEDGER
    assert rec["difference_cents"] == EXPECTED_BANK - EXPECTED_LEDGER


def test_matched_pairs(rec):
    assert [list(p) for p in rec["matched"]] == EXPECTED_MATCHED


def test_unmatched_ledger(rec):
    assert rec["unmatched_ledger"] == EXPECTED_UNMATCHED_LEDGER


def test_unmatched_bank(rec):
    assert rec["unmatched_bank"] == EXPECTED_UNMATCHED_BANK


def test_consistency(rec):
    ids = [p[0] for p in rec["matched"]]
    lines = [p[1] for p in rec["matched"]]
    assert len(set(ids)) == len(ids) and len(set(lines)) == len(lines)
    assert not set(ids) & set(rec["unmatched_ledger"])
    assert not set(lines) & set(rec["unmatched_bank"])
