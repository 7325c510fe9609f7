"""The red-team suite: attacks on verification through the public API, on bundled tasks.

Every unsolved attempt here must score exactly 0 with ``status=ok`` (a dodge that turns a 0
into an error or a timeout is a finding too)."""

from tests.integration.api.conftest import stack  # noqa: F401 (the shared fixture)
