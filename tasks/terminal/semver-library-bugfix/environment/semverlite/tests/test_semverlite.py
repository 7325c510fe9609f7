import pytest

from semverlite import compare, parse, satisfies


def test_parse_basic():
    v = parse("1.2.3-beta.1+exp.sha.5114f85")
    assert (v.major, v.minor, v.patch) == (1, 2, 3)
    assert v.prerelease == ("beta", "1")
    assert v.build == ("exp", "sha", "5114f85")


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse("1.2")


def test_compare_core():
    assert compare("1.10.0", "1.9.0") == 1
    assert compare("2.0.0", "2.0.0") == 0


def test_prerelease_lower_than_release():
    assert compare("1.0.0-alpha", "1.0.0") == -1


def test_prerelease_numeric_identifiers():
    assert compare("1.0.0-alpha.2", "1.0.0-alpha.10") == -1


def test_caret():
    assert satisfies("1.4.0", "^1.2.3")
    assert not satisfies("2.0.0", "^1.2.3")


def test_or_ranges():
    assert satisfies("3.1.0", "^1.0.0 || ^3.0.0")
