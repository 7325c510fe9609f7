"""Where sandboxes live: the ``SandboxRuntime`` protocol and its backends."""

from service.runtime.base import (
    ContainerInfo,
    ExecChunk,
    ExecRequest,
    ExecResult,
    FsChange,
    SandboxRuntime,
    SandboxSpec,
)

__all__ = [
    "ContainerInfo",
    "ExecChunk",
    "ExecRequest",
    "ExecResult",
    "FsChange",
    "SandboxRuntime",
    "SandboxSpec",
]
