"""``service.tasks.builds``: failures classified from ``data/network_errors.toml`` (network
retried, TLS and everything else once and remembered), a log per attempt, cancellation by
job. Attempts are plain functions here; the engine path is in the integration tests."""

from __future__ import annotations

import threading
import tomllib
from pathlib import Path

import pytest

from service.images import BuildCancelled, ImageBuildError
from service.tasks import builds
from service.tasks.builds import BuildTracker, TaskBuildFailed, classify

PATTERNS = tomllib.loads(builds.DATA_FILE.read_text())


@pytest.mark.parametrize("kind", ["tls", "network"])
def test_every_pattern_of_the_data_file_is_its_kind(kind: str) -> None:
    for pattern in PATTERNS[kind]["patterns"]:
        line = f"#8 12.3 ERROR: {pattern.upper()} while fetching https://x/simple/y/"
        assert classify(line) == kind, pattern


def test_tls_wins_over_network_and_the_rest_is_deterministic() -> None:
    both = (
        "Max retries exceeded ... SSLError(SSLCertVerificationError('certificate verify failed'))"
    )
    assert classify(both) == "tls"
    for text in (
        "dockerfile parse error line 2: unknown instruction: RUNN",
        "COPY failed: file not found in build context: stat not-there.txt",
        "The command '/bin/sh -c false' returned a non-zero code: 1",
        "E: Unable to locate package nosuchpackage",
        "ERROR: No matching distribution found for nosuchpackage==9.9",
        "",
    ):
        assert classify(text) == "deterministic", text


def _tracker(tmp_path: Path, attempts: int = 3) -> BuildTracker:
    return BuildTracker(tmp_path / "builds", attempts=attempts, retry_delay_s=0.01)


def _failing(text: str, calls: list[Path]):  # noqa: ANN202
    def attempt(log: Path, cancel: threading.Event) -> str:
        calls.append(log)
        log.write_text(f"step 1\n{text}\n")
        raise ImageBuildError(f"build failed\nfull log: {log}")

    return attempt


def test_network_failures_are_retried_each_with_its_own_log(tmp_path: Path) -> None:
    tracker, calls = _tracker(tmp_path), []
    with pytest.raises(ImageBuildError) as e:
        tracker.run(
            task="s/t",
            repository="r",
            digest="d1",
            attempt_fn=_failing("Could not resolve host: deb.debian.org", calls),
        )
    assert not isinstance(e.value, TaskBuildFailed)
    (build,) = tracker.list()
    assert [a.failure for a in build.attempts] == ["network"] * 3 and build.state == "failed"
    assert len(set(calls)) == 3 and all(p.read_text().startswith("step 1") for p in calls)
    data, nxt = builds.read_log(tracker.logs_dir, build.id, 2, offset=5)
    assert data == calls[1].read_bytes()[5:] and nxt == calls[1].stat().st_size
    assert builds.load_build(tracker.logs_dir, build.id)["state"] == "failed"


@pytest.mark.parametrize("text", ["unknown instruction: RUNN", "SSL: CERTIFICATE_VERIFY_FAILED"])
def test_deterministic_and_tls_failures_run_once_and_are_remembered(
    tmp_path: Path, text: str
) -> None:
    tracker, calls = _tracker(tmp_path), []
    fn = _failing(text, calls)
    with pytest.raises(TaskBuildFailed) as first:
        tracker.run(task="s/t", repository="r", digest="d2", attempt_fn=fn)
    with pytest.raises(TaskBuildFailed) as again:
        tracker.run(task="s/t", repository="r", digest="d2", attempt_fn=fn)
    assert len(calls) == 1 and again.value is first.value
    assert first.value.build_id in first.value.detail and first.value.status == 422
    assert ("CRUCIBLE_BUILD_CA_BUNDLE" in first.value.detail) == ("SSL" in text)
    tracker.forget_failures()
    with pytest.raises(TaskBuildFailed):
        tracker.run(task="s/t", repository="r", digest="d2", attempt_fn=fn)
    assert len(calls) == 2


def test_a_remembered_failure_is_readable_by_whoever_it_answered(tmp_path: Path) -> None:
    tracker, calls = _tracker(tmp_path), []
    fn = _failing("exit code 1", calls)
    with builds.on_behalf_of("job_a", tenant_id="alice"), pytest.raises(TaskBuildFailed):
        tracker.run(task="s/t", repository="r", digest="d3", attempt_fn=fn)
    with builds.on_behalf_of(None, tenant_id="bob"), pytest.raises(TaskBuildFailed):
        tracker.run(task="s/t", repository="r", digest="d3", attempt_fn=fn)
    (build,) = tracker.list()
    assert build.tenants == ["alice", "bob"]


def test_cancel_job_stops_a_build_only_when_no_one_else_wants_it(tmp_path: Path) -> None:
    tracker = _tracker(tmp_path)
    started, result = threading.Event(), {}

    def attempt(log: Path, cancel: threading.Event) -> str:
        started.set()
        if cancel.wait(10):
            raise BuildCancelled("cancelled")
        return "tag"

    def run() -> None:
        with builds.on_behalf_of("job_a", tenant_id="alice"):
            try:
                result["tag"] = tracker.run(
                    task="s/t", repository="r", digest="d4", attempt_fn=attempt
                )
            except BuildCancelled as e:
                result["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(5)
    build_id = tracker.running_for("d4")
    assert build_id is not None
    with builds.on_behalf_of("job_b", tenant_id="bob"):
        tracker.join(build_id)
    assert tracker.cancel_job("job_a") == []  # job_b still wants it
    assert tracker.cancel_job("job_b") == [build_id]
    thread.join(5)
    assert isinstance(result.get("error"), BuildCancelled)
    assert tracker.get(build_id).state == "cancelled"
    assert tracker.get(build_id).attempts[0].outcome == "cancelled"
