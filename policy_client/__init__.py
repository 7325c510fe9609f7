"""Crucible's policy client: the SDK, policies and the rollout runner.

The public surface is re-exported here (``tests/unit/test_policy_client_surface.py`` pins it).
``TorchPolicy`` lives in ``policy_client.policies.torch_policy`` (torch is optional) and the
Ray launcher in ``policy_client.ray_runner`` (ray is optional).
"""

from policy_client.client import AsyncClient, AsyncSandbox, Client, Sandbox
from policy_client.errors import (
    APIError,
    BadRequest,
    ClientError,
    ConflictError,
    NotFoundError,
    QuotaError,
    ServerError,
    TransportError,
    Unauthorized,
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
    "Client",
    "ClientError",
    "ConflictError",
    "ConsistencyReport",
    "EpisodeContext",
    "NoopPolicy",
    "NotFoundError",
    "OpenAICompatiblePolicy",
    "OraclePolicy",
    "Policy",
    "PolicyAction",
    "PolicyRequest",
    "QuotaError",
    "RolloutConfig",
    "RolloutRunner",
    "RoutedPolicy",
    "Sandbox",
    "ServerError",
    "TransportError",
    "Unauthorized",
]
