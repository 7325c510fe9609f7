"""The verifier network policy: which verifier sandboxes may reach a package index.

None by default. An install sets ``CRUCIBLE_VERIFIER_NETWORK=bridge`` (the network its
package index or proxy is reachable on) and says which tasks get it
(``CRUCIBLE_VERIFIER_NETWORK_TASKS``: ``asking``, those with ``[verifier] network = true``,
or ``all``). Such a verifier sandbox gets that network, ``verifier_env`` (index URLs,
proxies) and, with ``verifier_ca_bundle``, the CA file at ``VERIFIER_CA_PATH`` named by
the usual variables. The episode's own sandbox (the agent's) keeps its template's network
(``none`` for every task that does not allow internet): only the verifier's is changed, and
it is always a fresh container (never a warm one of the agent's pool).
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

from service.config import Settings
from service.errors import InvalidRequest
from service.runtime.base import SandboxRuntime
from service.tasks.models import Task

VERIFIER_CA_PATH = "/usr/local/share/crucible-verifier/ca.crt"
CA_VARIABLES = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE")


@dataclass(frozen=True)
class VerifierNetwork:
    """What a verifier sandbox gets: ``network``, extra ``env``, the CA's PEM text."""

    network: Literal["none", "bridge"] = "none"
    env: dict[str, str] = field(default_factory=dict)
    ca_bundle: str | None = None


def policy_for(settings: Settings, task: Task) -> VerifierNetwork:
    """The verifier network of ``task`` under this install's settings (``none`` unless the
    install has a verifier network and the task asks or the install gives it to all).

    Raises ``InvalidRequest`` (field ``verifier_ca_bundle``) when the CA file is unreadable.
    """
    if settings.verifier_network == "none":
        return VerifierNetwork()
    if settings.verifier_network_tasks == "asking" and not task.verifier_network:
        return VerifierNetwork()
    env = dict(settings.verifier_env)
    ca = None
    if settings.verifier_ca_bundle is not None:
        try:
            ca = settings.verifier_ca_bundle.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidRequest(
                f"verifier CA bundle {settings.verifier_ca_bundle}: {e}",
                field="verifier_ca_bundle",
            ) from e
        env.update(dict.fromkeys(CA_VARIABLES, VERIFIER_CA_PATH))
    return VerifierNetwork(network=settings.verifier_network, env=env, ca_bundle=ca)


def place_ca(runtime: SandboxRuntime, container_id: str, ca_bundle: str) -> None:
    """Write the CA file into a verifier sandbox before anything runs there (``/usr`` is a
    protected path: nothing of the agent's replays over it)."""
    path = PurePosixPath(VERIFIER_CA_PATH)
    data = ca_bundle.encode("ascii")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        parts = path.parent.parts[1:]
        for i in range(len(parts)):
            d = tarfile.TarInfo("/".join(parts[: i + 1]))
            d.type, d.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(d)
        info = tarfile.TarInfo(str(path)[1:])
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    runtime.put_archive(container_id, "/", buf.getvalue())
