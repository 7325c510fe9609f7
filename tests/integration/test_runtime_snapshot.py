"""A snapshot whose engine commit outlasts the runtime's call (trial 32).

The engine pauses the container for a commit and unpauses it when the commit ends, which
it does even after the client's call timed out. ``DockerRuntime.snapshot`` returned then
(a 502), the sandbox went back to ``leased``, a verification took it, its freeze found it
"already paused", and the commit's unpause ran the end state again under the verifier (an
unsolved episode's 0 became an error; the image it made was tracked by nothing). The
runtime now waits for the engine's commit to end and answers with what it made.
"""

from __future__ import annotations

import contextlib
import secrets
import time

import docker
import pytest

from service.runtime.base import LABEL_DEPLOYMENT
from service.runtime.docker import DockerRuntime

pytestmark = pytest.mark.docker


def test_a_commit_outlasting_the_engine_call_is_waited_for(sandbox_image: str) -> None:
    engine = docker.from_env()
    tag = secrets.token_hex(4)
    ctr = engine.containers.run(
        sandbox_image,
        [
            "sh",
            "-c",
            "mkdir /d && cd /d && seq 1 30000 | xargs touch && touch /ready && exec sleep infinity",
        ],
        detach=True,
        network_mode="none",
        labels={LABEL_DEPLOYMENT: f"test-snapshot-{tag}"},
    )
    ref = f"crucible-test-snapshots/{tag}:slow"
    try:
        for _ in range(600):  # the files are made
            if ctr.exec_run(["test", "-e", "/ready"]).exit_code == 0:
                break
            time.sleep(0.1)
        # a client whose calls time out long before the engine's commit of 30,000 files ends
        runtime = DockerRuntime(client=docker.from_env(timeout=1))
        image_id = runtime.snapshot(ctr.id, repository=ref.split(":")[0], tag="slow")
        assert image_id == engine.api.inspect_image(ref)["Id"]
        assert engine.api.inspect_container(ctr.id)["State"]["Paused"] is False
    finally:
        ctr.remove(force=True)
        with contextlib.suppress(docker.errors.ImageNotFound):
            engine.api.remove_image(ref)
