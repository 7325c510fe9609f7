"""Verifier for word-frequency-top20 (expected values computed from the pristine corpus)."""

import hashlib
import pathlib

OUT = pathlib.Path("/app/top_words.tsv")

EXPECTED = [
    ("harbor", 754),
    ("lantern", 362),
    ("river", 248),
    ("stone", 176),
    ("meadow", 139),
    ("signal", 111),
    ("copper", 100),
    ("glacier", 87),
    ("ember", 71),
    ("orchard", 71),
    ("ledger", 67),
    ("thistle", 55),
    ("falcon", 46),
    ("willow", 44),
    ("beacon", 42),
    ("compass", 42),
    ("marble", 37),
    ("cobalt", 35),
    ("quarry", 35),
    ("velvet", 35),
]

STOPWORDS = {
    "the",
    "a",
    "an",
    "and",
    "of",
    "to",
    "in",
    "on",
    "with",
    "for",
    "at",
    "by",
    "from",
    "is",
    "was",
    "it",
    "its",
    "that",
    "this",
    "as",
    "or",
    "but",
    "s",
}

CORPUS_SHA256 = {
    "README": "c7f4ecb76734315e0dd9c311ce92e1b4c4291101cc1ae755713a71fb9b71b953",
    "appendix/glossary.txt": "863f3696a2efdf81320efb4e3e96526e04c839fa3f3a640c46cafcb166b262f4",
    "appendix/notes.txt": "63b16a045c63e59ba3a8e4a77916f665a642fa762f2ee7eb3316d1c6ec7cf25f",
    "appendix/windows_export.txt": "b1539ecf42feff97bd3616d01e7d8e3df6bf34d57b48b1ad09ed903254f4f5f7",
    "chapter01.txt": "17c21e27df986b6ebfb9caf1a11ecef76c98861b3a494e5fd2e3311d0e3777c7",
    "chapter02.txt": "d0c0bb4a9270983bf024b60840702229ef2665bc1549a8d663d04d2c3b54ac42",
    "chapter03.txt": "08e754678edf4378ef688b9d6b6e6e7a90f4f64560b66f4061a95d0ceae5323d",
    "chapter04.txt.bak": "9d3c51cd388f0929ec34ba34a815939746aa27477e9ff52c39d5936206d94ba7",
    "drafts/old_chapter.md": "f39222dd6881c171f54b891f07b9805bff77c2f14fe5244db9e1abfc7012c277",
}


def _lines():
    assert OUT.is_file(), f"{OUT} does not exist"
    text = OUT.read_text()
    assert text.endswith("\n"), "file must end with a newline"
    return text.splitlines()


def test_exactly_twenty_lines():
    assert len(_lines()) == 20


def test_line_format():
    for line in _lines():
        parts = line.split("\t")
        assert len(parts) == 2, f"bad line {line!r}"
        word, count = parts
        assert word.isalpha() and word == word.lower() and word.isascii(), f"bad word {word!r}"
        assert count.isdigit(), f"bad count {count!r}"


def test_no_stopwords():
    for line in _lines():
        assert line.split("\t")[0] not in STOPWORDS


def test_words_and_counts_match():
    got = [(l.split("\t")[0], int(l.split("\t")[1])) for l in _lines()]
    assert got == EXPECTED


def test_corpus_untouched():
    corpus = pathlib.Path("/app/corpus")
    names = sorted(str(p.relative_to(corpus)) for p in corpus.rglob("*") if p.is_file())
    assert names == sorted(CORPUS_SHA256), names
    for name, digest in CORPUS_SHA256.items():
        assert hashlib.sha256((corpus / name).read_bytes()).hexdigest() == digest, name
