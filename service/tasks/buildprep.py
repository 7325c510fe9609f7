"""What a third-party task's Dockerfile needs to build here unchanged.

The task's own files are never edited. Its Dockerfile is rewritten into the build context
that is sent to the engine (``.crucible-build/Dockerfile``):

- **Image aliases.** A ``FROM`` naming an image this install aliases (``debian:bookworm-slim``
  -> ``crucible/base:latest``) builds on the alias's image **id**, so the content hash (and
  the image) follow the alias. ``FROM ${BASE_IMAGE}``, a stage name and an unaliased
  reference are left as written.
- **Build settings** (``CRUCIBLE_BUILD_*``), after every ``FROM``: the CA bundle is copied to
  ``BUILD_CA_PATH`` and named by ``PIP_CERT``, ``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE``,
  ``CURL_CA_BUNDLE`` and ``NODE_EXTRA_CA_CERTS`` (build arguments: RUN steps see them, the
  image's config never does), the pip index is ``PIP_INDEX_URL`` and ``UV_DEFAULT_INDEX``,
  the apt mirror replaces ``http://deb.debian.org`` in apt's sources. The final stage ends by
  removing the CA file. Proxies travel as Docker's predefined ``HTTP_PROXY`` arguments (kept
  out of the image's history by the engine).

Limits: the removal and the mirror step are RUN steps, so an image without ``rm``/``sh``
cannot take a CA bundle or a mirror; the CA file stays in the lower layer that copied it
(it holds public certificates only). Values of ``ARG``s other than the proxies show in
``docker history`` of the RUN steps: put no credentials in the index URL.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from service.config import Settings
from service.errors import InvalidRequest

BUILD_DIR = ".crucible-build"
DOCKERFILE_NAME = f"{BUILD_DIR}/Dockerfile"
CA_NAME = f"{BUILD_DIR}/ca.crt"
BUILD_CA_PATH = "/usr/local/share/crucible-build/ca.crt"
CA_VARIABLES = (
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
)
INDEX_VARIABLES = ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL")
DEBIAN_HOST = "http://deb.debian.org"
LABEL_ALIASES = "crucible.image_aliases"
LABEL_PRELUDE = "crucible.build_settings"

# FROM [--flag=value ...] <reference> [AS <name>]
_FROM_RE = re.compile(
    r"^(?P<lead>\s*FROM\s+(?:--\S+\s+)*)(?P<ref>\S+)(?P<rest>(?:\s+AS\s+(?P<stage>\S+))?\s*)$",
    re.IGNORECASE,
)
_USER_RE = re.compile(r"^\s*USER\s+(\S+)", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class BuildSettings:
    """The install's settings for task builds (see ``Settings.build_*``).

    ``aliases`` maps a ``FROM`` reference to a local image reference; ``ca_bundle`` is the
    PEM text (None: no CA step); ``build_args`` are extra engine build arguments (proxies,
    index URLs).
    """

    aliases: Mapping[str, str] = field(default_factory=dict)
    ca_bundle: str | None = None
    pip_index_url: str | None = None
    apt_mirror: str | None = None
    proxy: str | None = None
    no_proxy: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> BuildSettings:
        """Read aliases (file, then ``image_aliases`` over it) and the CA bundle's text.

        Raises ``InvalidRequest`` (field ``image_aliases_file`` or ``build_ca_bundle``) when a
        named file is missing or malformed.
        """
        aliases: dict[str, str] = {}
        if settings.image_aliases_file is not None:
            aliases.update(load_aliases(settings.image_aliases_file))
        aliases.update(settings.image_aliases)
        ca = None
        if settings.build_ca_bundle is not None:
            try:
                ca = settings.build_ca_bundle.read_text(encoding="ascii")
            except (OSError, UnicodeDecodeError) as e:
                raise InvalidRequest(
                    f"build CA bundle {settings.build_ca_bundle}: {e}", field="build_ca_bundle"
                ) from e
        return cls(
            aliases=aliases,
            ca_bundle=ca,
            pip_index_url=settings.build_pip_index_url,
            apt_mirror=settings.build_apt_mirror,
            proxy=settings.build_proxy,
            no_proxy=settings.build_no_proxy,
        )

    @property
    def build_args(self) -> dict[str, str]:
        """Engine build arguments: CA variables, index URLs, proxies (upper and lower case)."""
        args: dict[str, str] = {}
        if self.ca_bundle is not None:
            args.update(dict.fromkeys(CA_VARIABLES, BUILD_CA_PATH))
        if self.pip_index_url:
            args.update(dict.fromkeys(INDEX_VARIABLES, self.pip_index_url))
        for name, value in (
            ("HTTP_PROXY", self.proxy),
            ("HTTPS_PROXY", self.proxy),
            ("NO_PROXY", self.no_proxy),
        ):
            if value:
                args[name] = value
                args[name.lower()] = value
        return args


def load_aliases(path: Path) -> dict[str, str]:
    """``[aliases]`` of a TOML file: ``"<FROM reference>" = "<local image>"``.

    Raises ``InvalidRequest`` (field ``image_aliases_file``) when unreadable or not that shape.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise InvalidRequest(f"image aliases file {path}: {e}", field="image_aliases_file") from e
    table = data.get("aliases", {})
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in table.items()
    ):
        raise InvalidRequest(
            f"image aliases file {path}: [aliases] must map references to image names",
            field="image_aliases_file",
        )
    return dict(table)


def from_references(dockerfile_text: str) -> list[str]:
    """The literal image references of the ``FROM`` lines (no variables, no stage names)."""
    stages: set[str] = set()
    refs: list[str] = []
    for line in dockerfile_text.splitlines():
        m = _FROM_RE.match(line)
        if not m:
            continue
        ref = m.group("ref")
        if "$" not in ref and ref.lower() not in stages:
            refs.append(ref)
        if m.group("stage"):
            stages.add(m.group("stage").lower())
    return refs


@dataclass(frozen=True, kw_only=True)
class PreparedDockerfile:
    """A rewritten Dockerfile: ``text``, the extra context files (name -> text), the
    build arguments to send, and ``labels`` that make the content hash follow aliases and
    settings."""

    text: str
    files: dict[str, str]
    build_args: dict[str, str]
    labels: dict[str, str]


def prepare(
    dockerfile_text: str, *, settings: BuildSettings, alias_ids: Mapping[str, str]
) -> PreparedDockerfile:
    """Rewrite a Dockerfile for this install (module docstring).

    ``alias_ids`` maps each aliased ``FROM`` reference found by ``from_references`` to the
    image id its alias resolves to now.
    """
    lines = dockerfile_text.splitlines()
    out: list[str] = []
    stages: set[str] = set()
    prelude = _prelude(settings)
    last_from = max((i for i, line in enumerate(lines) if _FROM_RE.match(line)), default=-1)
    final_user: str | None = None
    for i, line in enumerate(lines):
        m = _FROM_RE.match(line)
        if not m:
            if i > last_from and (u := _USER_RE.match(line)):
                final_user = u.group(1)
            out.append(line)
            continue
        ref = m.group("ref")
        if "$" not in ref and ref.lower() not in stages and ref in alias_ids:
            line = f"{m.group('lead')}{alias_ids[ref]}{m.group('rest')}"
        if m.group("stage"):
            stages.add(m.group("stage").lower())
        out.append(line)
        out.extend(prelude)
    if settings.ca_bundle is not None and last_from >= 0:
        if final_user is not None:
            out.append("USER 0")
        out.append(f'RUN ["rm", "-f", "{BUILD_CA_PATH}"]')
        if final_user is not None:
            out.append(f"USER {final_user}")
    text = "\n".join(out) + "\n"
    files = {CA_NAME: settings.ca_bundle} if settings.ca_bundle is not None else {}
    used = {ref: alias_ids[ref] for ref in from_references(dockerfile_text) if ref in alias_ids}
    meta = {
        "prelude": prelude,
        "ca": hashlib.sha256(settings.ca_bundle.encode()).hexdigest()
        if settings.ca_bundle
        else None,
        "index": settings.pip_index_url,
    }
    labels = {LABEL_PRELUDE: hashlib.sha256(json.dumps(meta).encode()).hexdigest()[:12]}
    if used:
        labels[LABEL_ALIASES] = json.dumps(used, sort_keys=True)
    return PreparedDockerfile(text=text, files=files, build_args=settings.build_args, labels=labels)


def _prelude(settings: BuildSettings) -> list[str]:
    lines: list[str] = []
    if settings.ca_bundle is not None:
        lines.append(f"COPY {CA_NAME} {BUILD_CA_PATH}")
        lines.extend(f"ARG {name}" for name in CA_VARIABLES)
    if settings.pip_index_url:
        lines.extend(f"ARG {name}" for name in INDEX_VARIABLES)
    if settings.apt_mirror:
        mirror = settings.apt_mirror.rstrip("/").replace("#", r"\#")
        lines.append(
            "RUN for f in /etc/apt/sources.list /etc/apt/sources.list.d/*; do "
            f'[ -f "$f" ] && sed -i "s#{DEBIAN_HOST}#{mirror}#g" "$f"; done; true'
        )
    return lines
