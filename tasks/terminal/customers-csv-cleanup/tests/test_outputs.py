"""Verifier for customers-csv-cleanup (expected rows computed from the pristine export)."""

import csv
import json
import pathlib

import pytest

OUT = pathlib.Path("/app/customers_clean.csv")
STATS = pathlib.Path("/app/cleanup_stats.json")
HEADER = ["customer_id", "name", "email", "phone", "country", "signup_date"]

EXPECTED_ROWS = [
    ["5005", "Tomasz Martin", "tomasz.martin378@post.example.org", "+46580798694", "SE", "2021-09-05"],
    ["5007", "Marc Dubois", "marc.dubois107@post.example.org", "+3195494134", "NL", "2023-10-24"],
    ["5015", "Sofia de Vries", "sofia.devries357@post.example.org", "+4998188471", "DE", "2024-01-28"],
    ["5021", "Pieter García", "pieter.garcia450@mail.example", "+4996162718", "DE", "2023-03-18"],
    ["5025", "Chloe Rossi", "chloe.rossi193@example.com", "+3918900794", "IT", "2022-07-01"],
    ["5028", "Lena García", "lena.garcia823@post.example.org", "+33617666759", "FR", "2024-01-31"],
    ["5029", "Pablo Kowalski", "pablo.kowalski626@example.com", "+49498624760", "DE", "2022-07-30"],
    ["5031", "Pieter Rossi", "pieter.rossi163@example.com", "+46144462897", "SE", "2024-03-10"],
    ["5038", "Sofia Dubois", "sofia.dubois792@example.com", "+46169392194", "SE", "2023-08-06"],
    ["5043", "Maja Berg", "maja.berg553@post.example.org", "+486003522675", "PL", "2022-07-12"],
    ["5046", "Maja Schmidt", "maja.schmidt481@mail.example", "+4850480291", "PL", "2021-07-11"],
    ["5053", "Oskar García", "oskar.garcia317@example.com", "+46708537396", "SE", "2022-03-19"],
    ["5054", "Lena Lindström", "lena.lindstrom643@mail.example", "+48646320038", "PL", "2021-11-28"],
    ["5059", "Pieter de Vries", "pieter.devries70@mail.example", "+48504386778", "PL", "2023-05-05"],
    ["5063", "Pieter Schmidt", "pieter.schmidt654@mail.example", "+44655522159", "GB", "2022-12-19"],
    ["5064", "Pablo García", "pablo.garcia434@mail.example", "+44941709872", "GB", "2022-10-29"],
    ["5069", "Henri Martin", "henri.martin645@mail.example", "+46387027233", "SE", "2021-05-21"],
    ["5070", "Henri Berg", "henri.berg501@post.example.org", "+395981414316", "IT", "2024-03-11"],
    ["5071", "Lena Schmidt", "lena.schmidt460@mail.example", "+46047212476", "SE", "2021-12-31"],
    ["5074", "Ingrid Schmidt", "ingrid.schmidt913@post.example.org", "+487292220906", "PL", "2023-10-09"],
    ["5076", "Chloe Dubois", "chloe.dubois683@example.com", "+44715088541", "GB", "2024-01-02"],
    ["5078", "Sofia Rossi", "sofia.rossi434@example.com", "+3323543881", "FR", "2021-09-02"],
    ["5083", "Lena Kowalski", "lena.kowalski429@post.example.org", "+495688202134", "DE", "2021-02-04"],
    ["5089", "Pieter Kowalski", "pieter.kowalski249@example.com", "+398534965275", "IT", "2022-07-19"],
    ["5091", "Giulia Berg", "giulia.berg725@post.example.org", "+34879022036", "ES", "2023-01-07"],
    ["5094", "Pieter Dubois", "pieter.dubois357@post.example.org", "+490353653215", "DE", "2021-02-20"],
    ["5096", "Oskar Berg", "oskar.berg679@post.example.org", "+390733251379", "IT", "2022-07-04"],
    ["5100", "Giulia Lindström", "giulia.lindstrom498@example.com", "+4459493232", "GB", "2021-10-20"],
    ["5107", "Giulia Berg", "giulia.berg23@mail.example", "+39298634008", "IT", "2021-03-09"],
    ["5114", "Pablo Schmidt", "pablo.schmidt439@example.com", "+44706994670", "GB", "2022-08-19"],
    ["5117", "Giulia Dubois", "giulia.dubois757@mail.example", "+333517256651", "FR", "2023-06-27"],
    ["5120", "Giulia Dubois", "giulia.dubois781@example.com", "+499894367528", "DE", "2021-06-03"],
    ["5126", "Oskar Nowak", "oskar.nowak596@example.com", "+4837763575", "PL", "2023-08-29"],
    ["5132", "Maja Nowak", "maja.nowak210@post.example.org", "+3385713384", "FR", "2024-02-03"],
    ["5137", "Pablo Lindström", "pablo.lindstrom887@post.example.org", "+33364240655", "FR", "2023-07-22"],
    ["5141", "Giulia de Vries", "giulia.devries503@mail.example", "+481092713612", "PL", "2023-03-31"],
    ["5147", "Pablo Lindström", "pablo.lindstrom66@mail.example", "+483712566234", "PL", "2022-10-20"],
    ["5162", "Henri Rossi", "henri.rossi997@example.com", "+348585081782", "ES", "2023-05-12"],
    ["5167", "Henri Rossi", "henri.rossi450@mail.example", "+464108196899", "SE", "2023-11-01"],
    ["5172", "Marc Lindström", "marc.lindstrom894@example.com", "+4638622293", "SE", "2021-11-23"],
    ["5179", "Chloe Kowalski", "chloe.kowalski269@post.example.org", "+462986834131", "SE", "2022-05-25"],
    ["5184", "Chloe Dubois", "chloe.dubois383@example.com", "+3464181872", "ES", "2024-02-19"],
    ["5188", "Henri Dubois", "henri.dubois212@post.example.org", "+31167076094", "NL", "2022-08-01"],
    ["5189", "Pablo Dubois", "pablo.dubois386@example.com", "+31976123316", "NL", "2022-12-21"],
    ["5190", "Tomasz Nowak", "tomasz.nowak617@post.example.org", "+4847422531", "PL", "2023-06-14"],
    ["5199", "Oskar García", "oskar.garcia894@post.example.org", "+3332258488", "FR", "2022-10-12"],
    ["5202", "Lena Nowak", "lena.nowak151@mail.example", "+485763804319", "PL", "2022-01-25"],
    ["5203", "Pablo Berg", "pablo.berg948@post.example.org", "+3978165600", "IT", "2023-06-11"],
    ["5212", "Lena Lindström", "lena.lindstrom474@example.com", "+44191407541", "GB", "2021-03-05"],
    ["5213", "Pablo García", "pablo.garcia369@example.com", "+481161254583", "PL", "2023-04-06"],
    ["5220", "Lena Kowalski", "lena.kowalski866@mail.example", "+463210692529", "SE", "2023-07-14"],
    ["5221", "Oskar Rossi", "oskar.rossi504@example.com", "+349932418235", "ES", "2024-01-10"],
    ["5225", "Pablo de Vries", "pablo.devries216@example.com", "+342319443484", "ES", "2023-06-29"],
    ["5232", "Oskar Kowalski", "oskar.kowalski779@mail.example", "+4610521395", "SE", "2022-07-09"],
    ["5233", "Chloe Lindström", "chloe.lindstrom522@post.example.org", "+496341439462", "DE", "2024-02-05"],
    ["5240", "Oskar Nowak", "oskar.nowak607@example.com", "+4487712121", "GB", "2021-02-12"],
    ["5242", "Giulia Dubois", "giulia.dubois727@example.com", "+463064322895", "SE", "2022-08-05"],
    ["5248", "Pablo Martin", "pablo.martin291@post.example.org", "+48327135628", "PL", "2024-02-13"],
    ["5250", "Marc de Vries", "marc.devries708@post.example.org", "+48905983773", "PL", "2024-03-17"],
    ["5262", "Lena Kowalski", "lena.kowalski922@example.com", "+398659948527", "IT", "2022-05-31"],
    ["5281", "Lena Dubois", "lena.dubois121@mail.example", "+311034947049", "NL", "2023-02-02"],
    ["5285", "Chloe de Vries", "chloe.devries129@mail.example", "+313442416305", "NL", "2024-03-04"],
    ["5289", "Oskar Rossi", "oskar.rossi376@example.com", "+486960866552", "PL", "2023-08-12"],
    ["5295", "Marc Kowalski", "marc.kowalski526@example.com", "+496526273019", "DE", "2022-04-19"],
    ["5300", "Pablo Rossi", "pablo.rossi605@post.example.org", "+49728390634", "DE", "2023-12-31"],
    ["5307", "Tomasz Martin", "tomasz.martin944@example.com", "+33798975462", "FR", "2023-10-29"],
    ["5310", "Marc Rossi", "marc.rossi416@example.com", "+33097203309", "FR", "2022-12-28"],
    ["5311", "Marc de Vries", "marc.devries995@example.com", "+4833432208", "PL", "2024-02-05"],
    ["5316", "Giulia Rossi", "giulia.rossi647@example.com", "+341754488267", "ES", "2022-08-25"],
    ["5319", "Pablo Nowak", "pablo.nowak383@post.example.org", "+3352752297", "FR", "2022-11-30"],
    ["5321", "Tomasz Rossi", "tomasz.rossi38@post.example.org", "+33522320304", "FR", "2022-11-25"],
    ["5335", "Henri Schmidt", "henri.schmidt36@mail.example", "+3456117426", "ES", "2020-11-26"],
    ["5341", "Henri García", "henri.garcia991@mail.example", "+44320064257", "GB", "2023-04-17"],
    ["5345", "Giulia Dubois", "giulia.dubois614@post.example.org", "+34341674855", "ES", "2023-10-15"],
    ["5349", "Giulia Martin", "giulia.martin676@example.com", "+31837531045", "NL", "2021-08-05"],
    ["5351", "Chloe de Vries", "chloe.devries112@example.com", "+461167202044", "SE", "2023-04-09"],
    ["5356", "Chloe Berg", "chloe.berg913@example.com", "+4633964721", "SE", "2021-01-23"],
    ["5362", "Tomasz Nowak", "tomasz.nowak356@post.example.org", "+46163530508", "SE", "2021-11-03"],
    ["5370", "Giulia Berg", "giulia.berg95@example.com", "+3960670015", "IT", "2021-07-19"],
    ["5375", "Ingrid Kowalski", "ingrid.kowalski402@example.com", "+490580873425", "DE", "2022-09-22"],
    ["5379", "Oskar Nowak", "oskar.nowak958@mail.example", "+4618165300", "SE", "2021-07-29"],
    ["5380", "Ingrid García", "ingrid.garcia143@post.example.org", "+311452576909", "NL", "2022-05-31"],
    ["5383", "Pablo Nowak", "pablo.nowak802@example.com", "+4477003640", "GB", "2022-04-04"],
    ["5389", "Marc Lindström", "marc.lindstrom989@example.com", "+4468285385", "GB", "2021-07-26"],
    ["5393", "Oskar Kowalski", "oskar.kowalski573@post.example.org", "+4438198189", "GB", "2023-09-07"],
    ["5403", "Giulia de Vries", "giulia.devries628@example.com", "+332207978204", "FR", "2023-10-21"],
    ["5409", "Pieter García", "pieter.garcia112@post.example.org", "+4946169689", "DE", "2023-03-02"],
    ["5416", "Maja Schmidt", "maja.schmidt821@mail.example", "+4838841507", "PL", "2021-06-06"],
    ["5425", "Marc Martin", "marc.martin106@example.com", "+3925520903", "IT", "2022-08-10"],
    ["5433", "Tomasz Nowak", "tomasz.nowak117@example.com", "+3401561828", "ES", "2023-11-20"],
]
EXPECTED_STATS = {"input_rows": 123, "invalid_email": 4, "duplicates_removed": 29, "output_rows": 90}


@pytest.fixture(scope="module")
def rows():
    assert OUT.is_file(), f"missing {OUT}"
    data = OUT.read_bytes()
    assert b"\r" not in data, "use \\n line endings"
    with OUT.open(newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_header(rows):
    assert rows[0] == HEADER


def test_customer_ids_after_dedup(rows):
    assert [r[0] for r in rows[1:]] == [e[0] for e in EXPECTED_ROWS]


def test_names_and_emails(rows):
    for got, exp in zip(rows[1:], EXPECTED_ROWS):
        assert got[1:3] == exp[1:3], (got, exp)


def test_phones(rows):
    for got, exp in zip(rows[1:], EXPECTED_ROWS):
        assert got[3] == exp[3], (got, exp)


def test_countries(rows):
    for got, exp in zip(rows[1:], EXPECTED_ROWS):
        assert got[4] == exp[4], (got, exp)


def test_dates(rows):
    for got, exp in zip(rows[1:], EXPECTED_ROWS):
        assert got[5] == exp[5], (got, exp)


def test_full_rows(rows):
    assert rows[1:] == EXPECTED_ROWS


def test_stats():
    assert STATS.is_file(), f"missing {STATS}"
    assert json.loads(STATS.read_text()) == EXPECTED_STATS
