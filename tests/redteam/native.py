"""Native code as an agent would bring it: a shared object compiled from C source.

The task images carry no compiler, so the library is built in the image Crucible builds its
exec supervisor in (it has gcc and the same glibc as the task images) and uploaded as bytes,
the way an agent acting through the API would upload one it built elsewhere.
"""

from __future__ import annotations

import base64
import functools

import docker

from service.runtime.docker import SUPERVISOR_BUILD_REPOSITORY, supervisor_source_hash

# A constructor that, in any process able to read the hidden tests, copies their TOKEN into
# the answer; it also says where it ran, so a test can see which processes loaded it.
STEAL_TOKEN = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void steal(void) {
    char line[512], exe[256] = "?";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) exe[n] = 0;
    fprintf(stderr, "shim: loaded in %s\n", exe);
    FILE *f = fopen("/tests/test_outputs.py", "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "TOKEN = \"", 9) == 0) {
            char *end = strchr(line + 9, '"');
            if (end) *end = 0;
            FILE *out = fopen("/app/answer.txt", "w");
            if (out) { fputs(line + 9, out); fclose(out); }
            fprintf(stderr, "shim: read the hidden tests in %s\n", exe);
        }
    }
    fclose(f);
}
"""


@functools.cache
def compile_static(source: str) -> bytes:
    """The bytes of ``source`` (C) built as a static executable (``gcc -static``), the way
    an agent brings a program that needs no loader."""
    return _compile(source, "-static -O2")


@functools.cache
def compile_shared(source: str) -> bytes:
    """The bytes of ``source`` (C) built as a shared object (``gcc -shared -fPIC``).

    Raises ``docker.errors.ContainerError`` when it does not compile, ``ImageNotFound``
    when the supervisor's build image is missing (``DockerRuntime.ensure_ready`` builds it).
    """
    return _compile(source, "-shared -fPIC -O2")


def _compile(source: str, flags: str) -> bytes:
    image = f"{SUPERVISOR_BUILD_REPOSITORY}:{supervisor_source_hash()}"
    script = (
        f'echo "$SRC" | base64 -d > /tmp/s.c && gcc {flags} -o /tmp/s.so /tmp/s.c '
        "&& base64 /tmp/s.so"  # short lines: the engine splits log lines at 16 KiB
    )
    out = docker.from_env().containers.run(
        image,
        ["sh", "-c", script],
        environment={"SRC": base64.b64encode(source.encode()).decode()},
        network_mode="none",
        labels={"crucible.role": "test-compile"},
        remove=True,
    )
    data = base64.b64decode(b"".join(out.split()))
    assert data.startswith(b"\x7fELF"), data[:16]
    return data
