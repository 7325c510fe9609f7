"""The public surface of ``policy_client`` is pinned: adding or removing a name is a decision
(update this list with it), and importing it never pulls in torch or ray."""

from __future__ import annotations

import subprocess
import sys

import policy_client

PUBLIC = [
    "APIError",
    "AsyncClient",
    "AsyncSandbox",
    "BadRequest",
    "CapacityError",
    "Client",
    "ClientError",
    "ConflictError",
    "ConsistencyReport",
    "EpisodeContext",
    "ExecChunk",
    "Forbidden",
    "NoopPolicy",
    "NotFoundError",
    "OpenAICompatiblePolicy",
    "OraclePolicy",
    "PathOutsideRoot",
    "PayloadTooLarge",
    "Policy",
    "PolicyAction",
    "PolicyRequest",
    "QuotaError",
    "QuotaNeverFits",
    "RolloutConfig",
    "RolloutRunner",
    "RoutedPolicy",
    "Sandbox",
    "SandboxError",
    "ServerError",
    "TaskFormatError",
    "TransportError",
    "Unauthorized",
    "VerifierError",
]


def test_public_surface_is_pinned() -> None:
    assert policy_client.__all__ == PUBLIC
    for name in PUBLIC:
        assert getattr(policy_client, name).__module__.startswith("policy_client."), name


def test_every_public_class_is_documented() -> None:
    for name in PUBLIC:
        assert (getattr(policy_client, name).__doc__ or "").strip(), name


def test_import_keeps_optional_dependencies_optional() -> None:
    code = (
        "import sys, policy_client; "
        "print(sorted({'torch', 'ray', 'transformers'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
