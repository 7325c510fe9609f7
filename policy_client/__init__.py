"""Crucible's policy client: the SDK, policies and the rollout runner.

The public surface is re-exported here (``tests/unit/test_policy_client_surface.py`` pins it).
``TorchPolicy`` lives in ``policy_client.policies.torch_policy`` (torch is optional) and the
Ray launcher in ``policy_client.ray_runner`` (ray is optional).
"""

from policy_client.client import AsyncClient, AsyncSandbox, Client, ExecChunk, Sandbox
from policy_client.errors import (
    APIError,
    BadRequest,
    CapacityError,
    ClientError,
    ConflictError,
    Forbidden,
    NotFoundError,
    PathOutsideRoot,
    PayloadTooLarge,
    QuotaError,
    QuotaNeverFits,
    SandboxError,
    ServerError,
    TaskFormatError,
    TransportError,
    Unauthorized,
    VerifierError,
)
from policy_client.policies import (
    ConsistencyReport,
    EpisodeContext,
    NoopPolicy,
    OpenAICompatiblePolicy,
    OraclePolicy,
    Policy,
    PolicyAction,
    PolicyRequest,
    RoutedPolicy,
)
from policy_client.rollout import RolloutConfig, RolloutRunner

__all__ = [
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
