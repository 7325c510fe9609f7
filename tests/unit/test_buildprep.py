"""``service.tasks.buildprep``: a third-party Dockerfile rewritten for this install (image
aliases, a CA bundle present during RUN steps and removed after, index/mirror/proxy
arguments), the task's own file never changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import Settings
from service.errors import InvalidRequest
from service.tasks import buildprep
from service.tasks.buildprep import BUILD_CA_PATH, CA_NAME, BuildSettings, prepare

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
ALIAS_ID = "sha256:" + "a" * 64


def _prep(text: str, **settings: object) -> buildprep.PreparedDockerfile:
    s = BuildSettings(**settings)  # type: ignore[arg-type]
    ids = {r: ALIAS_ID for r in buildprep.from_references(text) if r in s.aliases}
    return prepare(text, settings=s, alias_ids=ids)


def test_aliased_from_builds_on_the_alias_image_id_others_untouched() -> None:
    text = (
        "FROM python:3.11-slim AS build\n"
        "RUN true\n"
        "FROM build\n"
        "FROM ${BASE_IMAGE}\n"
        "FROM --platform=linux/amd64 debian:bookworm-slim\n"
        "FROM alpine:3\n"
    )
    out = _prep(
        text,
        aliases={"python:3.11-slim": "x/py:latest", "debian:bookworm-slim": "crucible/base"},
    )
    froms = [line for line in out.text.splitlines() if line.upper().startswith("FROM")]
    assert froms == [
        f"FROM {ALIAS_ID} AS build",
        "FROM build",  # a stage name stays a stage name
        "FROM ${BASE_IMAGE}",
        f"FROM --platform=linux/amd64 {ALIAS_ID}",
        "FROM alpine:3",  # not aliased: as written
    ]
    assert "python:3.11-slim" in out.labels[buildprep.LABEL_ALIASES]
    assert "alpine:3" not in out.labels[buildprep.LABEL_ALIASES]


def test_the_alias_target_changes_the_labels_so_the_image_follows_it() -> None:
    text = "FROM debian:bookworm-slim\nRUN true\n"
    s = BuildSettings(aliases={"debian:bookworm-slim": "crucible/base"})
    one = prepare(text, settings=s, alias_ids={"debian:bookworm-slim": "sha256:" + "1" * 64})
    two = prepare(text, settings=s, alias_ids={"debian:bookworm-slim": "sha256:" + "2" * 64})
    assert one.labels != two.labels and one.text != two.text


def test_ca_bundle_is_copied_after_every_from_named_by_build_args_and_removed_at_the_end() -> None:
    text = "FROM debian:bookworm-slim AS a\nRUN true\nFROM a\nUSER app\nRUN pip install x\n"
    out = _prep(text, ca_bundle=PEM)
    lines = out.text.splitlines()
    copies = [i for i, line in enumerate(lines) if line == f"COPY {CA_NAME} {BUILD_CA_PATH}"]
    froms = [i for i, line in enumerate(lines) if line.startswith("FROM")]
    assert [c - 1 for c in copies] == froms  # right after each FROM
    assert out.files == {CA_NAME: PEM}
    for name in buildprep.CA_VARIABLES:
        assert out.build_args[name] == BUILD_CA_PATH
        assert f"ARG {name}" in lines
    # removed as root after the task's last step, then its user is back
    assert lines[-3:] == ["USER 0", f'RUN ["rm", "-f", "{BUILD_CA_PATH}"]', "USER app"]
    assert "ENV" not in out.text  # build arguments only: never in the image's config


def test_without_a_ca_bundle_nothing_is_added() -> None:
    text = "FROM debian:bookworm-slim\nRUN true\n"
    out = _prep(text)
    assert out.text == text and out.files == {} and out.build_args == {}


def test_index_mirror_and_proxy() -> None:
    text = "FROM debian:bookworm-slim\nRUN apt-get update\n"
    out = _prep(
        text,
        pip_index_url="http://pypi.internal/simple",
        apt_mirror="http://mirror.internal/debian/",
        proxy="http://proxy:3128",
        no_proxy="localhost",
    )
    for name in buildprep.INDEX_VARIABLES:
        assert out.build_args[name] == "http://pypi.internal/simple"
        assert f"ARG {name}" in out.text
    for name, value in (("HTTP_PROXY", "http://proxy:3128"), ("NO_PROXY", "localhost")):
        assert out.build_args[name] == out.build_args[name.lower()] == value
    assert "HTTP_PROXY" not in out.text  # predefined by the engine, kept out of history
    mirror = [line for line in out.text.splitlines() if "sed -i" in line]
    assert (
        len(mirror) == 1 and "s#http://deb.debian.org#http://mirror.internal/debian#g" in mirror[0]
    )
    assert out.text.index("sed -i") < out.text.index("apt-get update")


def test_settings_that_change_the_build_change_its_labels() -> None:
    text = "FROM debian:bookworm-slim\n"
    base = _prep(text).labels
    assert _prep(text, ca_bundle=PEM).labels != base
    assert _prep(text, pip_index_url="http://i/simple").labels != base
    assert _prep(text, apt_mirror="http://m/debian").labels != base


def test_from_settings_reads_the_files_and_names_bad_ones(tmp_path: Path) -> None:
    aliases = tmp_path / "aliases.toml"
    aliases.write_text('[aliases]\n"debian:bookworm-slim" = "crucible/base"\n"a" = "b"\n')
    ca = tmp_path / "ca.pem"
    ca.write_text(PEM)
    s = Settings(image_aliases_file=aliases, image_aliases={"a": "c"}, build_ca_bundle=ca)
    got = BuildSettings.from_settings(s)
    assert got.aliases == {"debian:bookworm-slim": "crucible/base", "a": "c"}  # setting wins
    assert got.ca_bundle == PEM
    aliases.write_text('[aliases]\n"x" = 3\n')
    with pytest.raises(InvalidRequest) as e:
        BuildSettings.from_settings(s)
    assert e.value.field == "image_aliases_file"
    with pytest.raises(InvalidRequest) as e:
        BuildSettings.from_settings(Settings(build_ca_bundle=tmp_path / "missing.pem"))
    assert e.value.field == "build_ca_bundle"
