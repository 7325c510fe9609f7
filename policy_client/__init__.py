"""Crucible's policy client: the SDK, policies and the rollout runner.

The public surface is re-exported here (``tests/unit/test_policy_client_surface.py`` pins it).
"""

from policy_client.client import AsyncClient, Client, Sandbox
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
    EpisodeContext,
    NoopPolicy,
    OraclePolicy,
    Policy,
    PolicyAction,
    PolicyRequest,
)
from policy_client.rollout import RolloutConfig, RolloutRunner

__all__ = [
    "APIError",
    "AsyncClient",
    "BadRequest",
    "Client",
    "ClientError",
    "ConflictError",
    "EpisodeContext",
    "NoopPolicy",
    "NotFoundError",
    "OraclePolicy",
    "Policy",
    "PolicyAction",
    "PolicyRequest",
    "QuotaError",
    "RolloutConfig",
    "RolloutRunner",
    "Sandbox",
    "ServerError",
    "TransportError",
    "Unauthorized",
]
