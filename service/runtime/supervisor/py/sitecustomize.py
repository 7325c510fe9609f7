"""Crucible's empty default ``sitecustomize`` for the verifier's sandbox.

``crucible_guard`` gives a pristine module precedence over an agent-written one of the same
name; this file is the pristine candidate when the task image has no ``sitecustomize`` of
its own, so an agent-written one on ``PYTHONPATH`` never runs at interpreter start-up.
"""
