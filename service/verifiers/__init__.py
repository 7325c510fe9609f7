"""Verifiers: deterministic code that scores an episode's end state, isolated from the agent."""

from service.verifiers.base import VerifierResult

__all__ = ["VerifierResult"]
