"""Verifier for release-tarball-exact."""

import hashlib
import pathlib
import stat
import tarfile

import pytest

ARCHIVE = pathlib.Path("/app/dist/myapp-1.4.2.tar.gz")
PREFIX = "myapp-1.4.2/"

EXPECTED = {
    "LICENSE": "a055235a460e2b8910e318fcc92f91bb9ae9ed1115d28f3d546a7ec8d6485e32",
    "README.md": "7fc1c700dffca0800cb1a426f7e759295cbad08601bb0ca6c3be0349728a067c",
    "bin/myapp": "0785d808bdf5ebce0c68394818da1c71b1041311a22a188bae833c1f2ccc1b22",
    "docs/img/diagram.svg": "f502af1820bfc04f67ff9daac2ae7a392e23c7cb6c3dfa5422db05fd9538be19",
    "docs/index.md": "63b4b8d39945ef5f9cc5f21726b6ca932cf13c896f2ac390c295d8046cabb10c",
    "docs/tests/overview.md": "ab7be54702a0bb0ca6712b068dbe2960c1cbeddfd6c7b9632a3a69dd57a6537b",
    "docs/usage.md": "b641f47766ed20afc7fda4665a77e96acce55f68782e0b4049c1f655429b75be",
    "pyproject.toml": "53c2f02445f1f0966c9490ec2b25b0082fa37c21ddb3fa82c813c5711293c02c",
    "src/myapp/__init__.py": "aa39e02a68dcc0a9f573f070028b9575a8be4db9ee299a39e846ea45d20bc5a2",
    "src/myapp/cli.py": "2d0e69c52636e07d8c9045c2af0070518f11d5a861704fdd20b324c7f2d29d6b",
    "src/myapp/data/.keep": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "src/myapp/data/postcodes.csv": "79654f6837337e34dd6823aee3edef929ba071666456c94a54bf7648d8d6ab0d",
    "src/myapp/tests_helpers.py": "23f1703d8ab41d9b41c5f03b355eaebb4f7f8128bfd76807f0615757d2a7d4cd",
    "src/myapp/weather/__init__.py": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "src/myapp/weather/providers.py": "2c87b0c5c18fd1d8f6e332dc8b7859f1b6a6f694f6094010303d5f6622581117",
}


@pytest.fixture(scope="module")
def tar():
    assert ARCHIVE.is_file(), f"missing {ARCHIVE}"
    with open(ARCHIVE, "rb") as f:
        assert f.read(2) == b"\x1f\x8b", "not gzip-compressed"
    t = tarfile.open(ARCHIVE, "r:gz")
    yield t
    t.close()


def _files(tar):
    return {m.name: m for m in tar.getmembers() if m.isfile()}


def test_only_files_and_dirs(tar):
    for m in tar.getmembers():
        assert m.isfile() or m.isdir(), f"unexpected member type: {m.name}"


def test_all_members_prefixed(tar):
    for m in tar.getmembers():
        name = m.name.rstrip("/")
        assert name == PREFIX.rstrip("/") or name.startswith(PREFIX), m.name


def test_exact_file_set(tar):
    expected = {PREFIX + k for k in EXPECTED} | {PREFIX + "MANIFEST.sha256"}
    assert set(_files(tar)) == expected


def test_file_contents(tar):
    files = _files(tar)
    for rel, digest in EXPECTED.items():
        data = tar.extractfile(files[PREFIX + rel]).read()
        assert hashlib.sha256(data).hexdigest() == digest, rel


def test_ownership_numeric_root(tar):
    for m in tar.getmembers():
        assert m.uid == 0 and m.gid == 0, (m.name, m.uid, m.gid)


def test_executable_preserved(tar):
    m = _files(tar)[PREFIX + "bin/myapp"]
    assert m.mode & stat.S_IXUSR
    assert not (_files(tar)[PREFIX + "README.md"].mode & stat.S_IXUSR)


def test_manifest(tar):
    data = tar.extractfile(_files(tar)[PREFIX + "MANIFEST.sha256"]).read().decode()
    expected = "".join(f"{EXPECTED[k]}  {k}\n" for k in sorted(EXPECTED, key=lambda s: s.encode()))
    assert data == expected
