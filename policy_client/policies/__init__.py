"""Policies: the ``Policy`` protocol and its implementations.

``OraclePolicy`` and ``NoopPolicy`` (scripted), ``OpenAICompatiblePolicy`` and ``RoutedPolicy``
(served models), and ``policy_client.policies.torch_policy.TorchPolicy`` (a local
transformers model; imported from its module so that torch stays optional).
"""

from policy_client.policies.base import (
    EpisodeContext,
    Policy,
    PolicyAction,
    PolicyRequest,
    Traffic,
)
from policy_client.policies.openai_compat import (
    Completion,
    ConsistencyReport,
    OpenAICompatiblePolicy,
    RoutedPolicy,
    SampleDrift,
)
from policy_client.policies.scripted import NoopPolicy, OraclePolicy

__all__ = [
    "Completion",
    "ConsistencyReport",
    "EpisodeContext",
    "NoopPolicy",
    "OpenAICompatiblePolicy",
    "OraclePolicy",
    "Policy",
    "PolicyAction",
    "PolicyRequest",
    "RoutedPolicy",
    "SampleDrift",
    "Traffic",
]
