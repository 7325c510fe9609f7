"""Policies: the ``Policy`` protocol and its implementations (scripted, torch, OpenAI)."""

from policy_client.policies.base import EpisodeContext, Policy, PolicyAction, PolicyRequest
from policy_client.policies.scripted import NoopPolicy, OraclePolicy

__all__ = [
    "EpisodeContext",
    "NoopPolicy",
    "OraclePolicy",
    "Policy",
    "PolicyAction",
    "PolicyRequest",
]
