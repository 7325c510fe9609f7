"""Task loading (Harbor and Terminal-Bench 1 layouts), suites, and the registry without Docker.

Fixture tasks live in ``tests/fixtures/tasks/{good,broken}/``; error messages are asserted
exactly, with the current directory set to ``tests/fixtures`` so paths read ``tasks/...``.
Variations of a fixture are made by copying it into ``tmp_path`` and editing one file.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

import service.tasks.registry as registry_module
from service.errors import InvalidRequest, NotFound, TaskFormatError
from service.tasks import (
    Suite,
    Task,
    TaskRegistry,
    discover_suites,
    image_repository,
    load_suite,
    load_task,
    task_version,
    template_for,
    template_name,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
GOOD = FIXTURES / "tasks" / "good"
BROKEN = FIXTURES / "tasks" / "broken"
BUNDLED = REPO / "tasks"


@pytest.fixture(autouse=True)
def _in_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)


def _copy(name: str, tmp_path: Path, *, suite: str = "suite") -> Path:
    target = tmp_path / suite / name
    shutil.copytree(GOOD / name, target)
    return target


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def _error(path: Path) -> TaskFormatError:
    with pytest.raises(TaskFormatError) as info:
        load_task(path)
    return info.value


# --------------------------------------------------------------------------- valid tasks


def test_harbor_task_loads_every_field() -> None:
    task = load_task(GOOD / "harbor-hello")
    root = GOOD / "harbor-hello"
    assert (task.id, task.suite, task.path, task.format) == ("harbor-hello", "good", root, "harbor")
    assert task.domain == "terminal" and task.verifier == "terminal"
    assert task.instruction.startswith("Write the contents of `/srv/work/hello.txt`")
    assert (task.agent_timeout_s, task.verifier_timeout_s) == (300.0, 60.0)
    env = task.environment
    assert (env.cpus, env.memory_mb, env.storage_mb, env.gpus) == (2.0, 1024, 2048, 0)
    assert (env.allow_internet, env.workdir, env.build_timeout_s) == (False, "/srv/work", 300.0)
    assert env.context_dir == root / "environment" and env.docker_image is None
    assert task.environment_dir == root / "environment"
    assert task.solution_path == root / "solution" / "solve.sh"
    assert task.tests_dir == root / "tests" and task.test_script == root / "tests" / "test.sh"
    assert task.test_command == "bash /tests/test.sh"
    assert task.test_env == {"GREETING": "hello"}
    assert task.reward_source == "reward_file"
    assert (task.expected_tests, task.pass_threshold) == (1, 1.0)
    assert task.verifier_settings == {"partial_credit": False}
    assert task.metadata == {
        "author_name": "Crucible tests",
        "difficulty": "easy",
        "category": "fixture",
        "tags": ["fixture", "harbor"],
    }
    assert task.notes == ("task.toml: unknown key [environment].os ignored",)
    assert len(task.version) == 16 and task.version == task_version(root)
    assert task.key == "good/harbor-hello"


def test_tb1_task_loads_and_maps_onto_crucible() -> None:
    task = load_task(GOOD / "tb1-hello")
    root = GOOD / "tb1-hello"
    assert (task.format, task.domain, task.verifier) == ("tb1", "terminal", "terminal")
    assert task.instruction == (
        "Count the lines of /app/data.txt and write the number to /app/count.txt."
    )
    assert (task.agent_timeout_s, task.verifier_timeout_s) == (900.0, 180.0)
    env = task.environment
    assert env.context_dir == root and env.docker_image is None  # the root is the context
    assert (env.cpus, env.memory_mb, env.storage_mb, env.allow_internet) == (1.0, 2048, 10240, True)
    assert env.workdir == "/app"  # the Dockerfile's WORKDIR
    assert task.solution_path == root / "solution.sh"
    assert task.tests_dir == root / "tests" and task.test_script == root / "run-tests.sh"
    assert task.test_command == "bash /tests/run-tests.sh"
    assert task.test_env == {"TEST_DIR": "/tests"}
    assert task.reward_source == "exit_code"
    assert task.expected_tests is None and task.pass_threshold == 1.0
    assert task.metadata["author_email"] == "tests@example.com"
    assert task.metadata["tags"] == ["fixture", "tb1"]
    assert task.metadata["expert_time_estimate_min"] == 2
    assert task.notes == (
        "docker-compose.yaml ignored: Crucible runs one sandbox built from the Dockerfile",
    )


def test_task_serializes_to_json() -> None:
    task = load_task(GOOD / "harbor-hello")
    data = task.model_dump(mode="json")
    assert data["path"].endswith("tests/fixtures/tasks/good/harbor-hello")
    assert Task.model_validate(data) == task


# --------------------------------------------------------------------------- malformed tasks


@pytest.mark.parametrize(
    ("folder", "message", "field"),
    [
        (
            "bad-type",
            "tasks/broken/bad-type/task.toml: [agent].timeout_sec: Input should be a valid number",
            "[agent].timeout_sec",
        ),
        (
            "missing-instruction",
            "tasks/broken/missing-instruction/instruction.md: missing",
            "instruction.md",
        ),
        (
            "bad-toml",
            "tasks/broken/bad-toml/task.toml: invalid TOML: Expected newline or end of document "
            "after a statement (at line 4, column 21)",
            "task.toml",
        ),
        (
            "unknown-domain",
            "tasks/broken/unknown-domain/task.toml: [crucible].domain: Input should be "
            "'terminal', 'document' or 'cad'",
            "[crucible].domain",
        ),
        (
            "bad-workdir",
            "tasks/broken/bad-workdir/task.toml: [environment].workdir: must be an absolute "
            "path without '..' or '.' parts (got 'app/../etc')",
            "[environment].workdir",
        ),
        (
            "missing-test-sh",
            "tasks/broken/missing-test-sh/tests/test.sh: missing",
            "tests/test.sh",
        ),
        (
            "crucible-typo",
            "tasks/broken/crucible-typo/task.toml: [crucible].pass_treshold: Extra inputs are "
            "not permitted",
            "[crucible].pass_treshold",
        ),
        (
            "no-config",
            "tasks/broken/no-config/task.toml: missing (a task folder needs task.toml or "
            "task.yaml)",
            "task.toml",
        ),
        (
            "tb1-bad-yaml",
            "tasks/broken/tb1-bad-yaml/task.yaml: invalid YAML at line 3, column 11: expected "
            "',' or ']', but got ':'",
            "task.yaml",
        ),
        (
            "tb1-wrong-type",
            "tasks/broken/tb1-wrong-type/task.yaml: max_agent_timeout_sec: Input should be a "
            "valid number",
            "max_agent_timeout_sec",
        ),
    ],
)
def test_malformed_task_names_file_and_field(folder: str, message: str, field: str) -> None:
    error = _error(BROKEN / folder)
    assert error.detail == message
    assert str(error) == message
    assert error.field == field
    assert error.status == 422


def test_several_errors_are_all_listed(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    _edit(task / "task.toml", "cpus = 2", 'cpus = "two"')
    _edit(task / "task.toml", "storage_mb = 2048", "storage_mb = -5")
    error = _error(task)
    assert error.detail.endswith(
        "task.toml: [environment].cpus: Input should be a valid number; "
        "[environment].storage_mb: Input should be greater than or equal to 16"
    )
    assert error.field == "[environment].cpus"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "[agent]\ntimeout_sec = 300.0",
            "[agent]\ntimeout_sec = 0",
            "[agent].timeout_sec: Input should be greater than 0",
        ),
        (
            "allow_internet = false",
            'allow_internet = "no"',
            "[environment].allow_internet: Input should be a valid boolean",
        ),
        (
            'memory = "1G"',
            'memory = "lots"',
            "[environment].memory: invalid size 'lots'; expected a number and a unit, like "
            "'512M' or '2G'",
        ),
        ('memory = "1G"', "memory = 1024", "[environment].memory: Input should be a valid string"),
        (
            "expected_tests = 1",
            "expected_tests = 1.5",
            "[crucible].expected_tests: Input should be a valid integer",
        ),
        (
            "pass_threshold = 1.0",
            "pass_threshold = 2.0",
            "[crucible].pass_threshold: Input should be less than or equal to 1",
        ),
        ('version = "1.0"', "version = 1.0", "version: Input should be a valid string"),
        (
            "[metadata]",
            "metadata = 5\n[not_metadata]",
            "[metadata]: Input should be a valid dictionary",
        ),
        (
            'domain = "terminal"',
            'domain = "terminal"\nverifier = "Bad Name"',
            "[crucible].verifier: must be a lowercase identifier like 'terminal' (got 'Bad Name')",
        ),
    ],
)
def test_harbor_value_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    task = _copy("harbor-hello", tmp_path)
    _edit(task / "task.toml", old, new)
    assert _error(task).detail == f"{task}/task.toml: {message}"


def test_memory_string_past_the_template_limit(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    _edit(task / "task.toml", 'memory = "1G"', 'memory = "300G"')
    assert _error(task).detail == (
        f"{task}/task.toml: [environment].memory_mb: Input should be less than or equal to 262144"
    )


def test_toml_error_at_end_of_file_still_has_a_line(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    with (task / "task.toml").open("a") as fh:
        fh.write('\n[extra]\nlist = ["never closed"')
    detail = _error(task).detail
    assert detail.startswith(f"{task}/task.toml: invalid TOML: Unclosed array")
    assert detail.endswith("(at end of document, line 34)")  # the last line


def test_missing_and_empty_files(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    (task / "environment" / "Dockerfile").unlink()
    assert _error(task).detail == (
        f"{task}/environment/Dockerfile: missing (or set [environment].docker_image in task.toml)"
    )
    task = _copy("harbor-hello", tmp_path / "b")
    (task / "instruction.md").write_text("  \n")
    assert _error(task).detail == f"{task}/instruction.md: empty"
    (task / "instruction.md").write_bytes(b"caf\xe9\n")
    assert _error(task).detail == f"{task}/instruction.md: not valid UTF-8 (byte 3)"


def test_bad_folder_names(tmp_path: Path) -> None:
    assert _error(tmp_path / "nope").detail == f"{tmp_path}/nope: not a task folder (missing)"
    odd = shutil.copytree(GOOD / "harbor-hello", tmp_path / "has space")
    assert "task folder name 'has space' must be letters" in _error(odd).detail


# --------------------------------------------------------------------------- Harbor variations


def test_harbor_defaults_match_harbor(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    (task / "task.toml").write_text("")  # every table left out
    loaded = load_task(task)
    env = loaded.environment
    assert (loaded.agent_timeout_s, loaded.verifier_timeout_s) == (600.0, 600.0)
    assert (env.cpus, env.memory_mb, env.storage_mb, env.build_timeout_s) == (1, 2048, 10240, 600)
    assert env.allow_internet is True and env.workdir == "/app"
    assert (loaded.domain, loaded.verifier, loaded.expected_tests) == ("terminal", "terminal", None)
    assert loaded.metadata == {} and loaded.notes == ()


def test_harbor_prebuilt_image_needs_no_environment(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    shutil.rmtree(task / "environment")
    _edit(task / "task.toml", "cpus = 2", 'cpus = 2\ndocker_image = "example/prebuilt:1.0"')
    loaded = load_task(task)
    assert loaded.environment.docker_image == "example/prebuilt:1.0"
    assert loaded.environment_dir is None
    assert TaskRegistry().ensure_image(loaded, base_image="unused") == "example/prebuilt:1.0"


def test_harbor_schema_version_and_unknown_tables_are_accepted(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    _edit(task / "task.toml", 'version = "1.0"', 'schema_version = "1.1"\nsource = "tb2"')
    with (task / "task.toml").open("a") as fh:
        fh.write('\n[solution]\nenv = { A = "1" }\n')
    loaded = load_task(task)
    assert "task.toml: unknown key 'source' ignored" in loaded.notes
    assert "task.toml: unknown key 'solution' ignored" in loaded.notes


def test_harbor_storage_string_gpus_and_env_are_noted(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    _edit(
        task / "task.toml",
        "storage_mb = 2048",
        'storage = "4G"\ngpus = 1\nenv = { OPENAI_API_KEY = "${OPENAI_API_KEY}" }',
    )
    loaded = load_task(task)
    assert loaded.environment.storage_mb == 4096 and loaded.environment.gpus == 1
    assert "[environment].gpus = 1 ignored: Crucible sandboxes have no GPUs" in loaded.notes
    assert any(n.startswith("[environment].env ignored") for n in loaded.notes)


def test_document_task_needs_no_test_sh(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    (task / "tests" / "test.sh").unlink()
    (task / "tests" / "answer.json").write_text('{"total": 3}')
    _edit(task / "task.toml", 'domain = "terminal"', 'domain = "document"')
    loaded = load_task(task)
    assert (loaded.domain, loaded.verifier) == ("document", "document")
    assert loaded.test_script is None and loaded.test_command is None
    assert loaded.tests_dir == task / "tests"


def test_missing_solution_is_noted(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    shutil.rmtree(task / "solution")
    loaded = load_task(task)
    assert loaded.solution_path is None
    assert "solution/solve.sh missing: the task has no oracle" in loaded.notes


def test_task_toml_wins_over_task_yaml(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    shutil.copy(GOOD / "tb1-hello" / "task.yaml", task / "task.yaml")
    loaded = load_task(task)
    assert loaded.format == "harbor"
    assert "task.yaml ignored: task.toml takes precedence" in loaded.notes


# --------------------------------------------------------------------------- TB1 variations


def test_tb1_solution_yaml_is_noted_as_unsupported(tmp_path: Path) -> None:
    task = _copy("tb1-hello", tmp_path)
    (task / "solution.sh").unlink()
    (task / "solution.yaml").write_text("- command: wc -l data.txt\n  block: true\n")
    loaded = load_task(task)
    assert loaded.solution_path is None
    assert any(n.startswith("solution.yaml is not supported") for n in loaded.notes)


@pytest.mark.parametrize(
    ("line", "leaks"),
    [
        ("COPY . /app/", True),
        ("COPY ./tests /app/tests", True),
        ('COPY ["solution.sh", "/app/"]', True),
        ("ADD --chown=1000:1000 run-tests.sh data.txt /app/", True),
        ("COPY data.txt /app/data.txt", False),
        ("COPY --from=builder /tests /app/", False),
    ],
)
def test_tb1_dockerfile_copying_tests_is_noted(tmp_path: Path, line: str, leaks: bool) -> None:
    task = _copy("tb1-hello", tmp_path)
    _edit(task / "Dockerfile", "COPY data.txt /app/data.txt", line)
    noted = any(n.startswith("Dockerfile copies tests") for n in load_task(task).notes)
    assert noted == leaks


def test_tb1_legacy_descriptions_and_extra_keys(tmp_path: Path) -> None:
    task = _copy("tb1-hello", tmp_path)
    (task / "task.yaml").write_text(
        "descriptions:\n"
        "  - key: hard\n    description: Terse.\n"
        "  - key: base\n    description: The base prompt.\n"
        "difficulty: easy\n"
        "test_scripts: [setup.sh]\n"
    )
    loaded = load_task(task)
    assert loaded.instruction == "The base prompt."
    assert (loaded.agent_timeout_s, loaded.verifier_timeout_s) == (360.0, 60.0)  # TB1 defaults
    assert "task.yaml: unknown key 'test_scripts' ignored" in loaded.notes


def test_tb1_crucible_mapping_and_workdir(tmp_path: Path) -> None:
    task = _copy("tb1-hello", tmp_path)
    with (task / "task.yaml").open("a") as fh:
        fh.write("\ncrucible:\n  expected_tests: 1\n  pass_threshold: 0.5\n")
    _edit(task / "Dockerfile", "WORKDIR /app", "WORKDIR /opt/project/")
    loaded = load_task(task)
    assert (loaded.expected_tests, loaded.pass_threshold) == (1, 0.5)
    assert loaded.environment.workdir == "/opt/project"
    _edit(task / "Dockerfile", "WORKDIR /opt/project/", "WORKDIR $HOME")
    assert load_task(task).environment.workdir == "/app"


def test_tb1_without_run_tests_runs_pytest(tmp_path: Path) -> None:
    task = _copy("tb1-hello", tmp_path)
    (task / "run-tests.sh").unlink()
    assert _error(task).detail == f"{task}/run-tests.sh: missing"
    (task / "tests" / "check_outputs.py").rename(task / "tests" / "test_outputs.py")
    loaded = load_task(task)
    assert loaded.test_script is None
    assert loaded.test_command == "python3 -m pytest -rA /tests/test_outputs.py"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("- a\n- b\n", "task.yaml: expected a mapping of keys at the top level, got list"),
        ("", "task.yaml: expected a mapping of keys at the top level, got nothing"),
        ("difficulty: easy\n", "task.yaml: instruction: Field required"),
        ("instruction: ''\n", "task.yaml: instruction: empty"),
        ("instruction: x\ntags: [1, two]\n", "task.yaml: tags[0]: Input should be a valid string"),
        (
            "instruction: x\ncrucible:\n  domain: lab\n",
            "task.yaml: crucible.domain: Input should be 'terminal', 'document' or 'cad'",
        ),
        (
            "instruction: x\nmax_test_timeout_sec: -1\n",
            "task.yaml: max_test_timeout_sec: Input should be greater than 0",
        ),
    ],
)
def test_tb1_value_errors(tmp_path: Path, content: str, message: str) -> None:
    task = _copy("tb1-hello", tmp_path)
    (task / "task.yaml").write_text(content)
    assert _error(task).detail == f"{task}/{message}"


def test_tb1_missing_dockerfile_and_env_name(tmp_path: Path) -> None:
    task = _copy("tb1-hello", tmp_path)
    (task / "Dockerfile").unlink()
    assert _error(task).detail == f"{task}/Dockerfile: missing"
    with (task / "task.yaml").open("a") as fh:
        fh.write("\nenv_name: python-3-13\n")
    assert _error(task).detail == (
        f"{task}/task.yaml: env_name: shared TB1 environments are not supported; give the task "
        "its own Dockerfile"
    )


# --------------------------------------------------------------------------- versions


def test_version_covers_every_file_and_ignores_bytecode(tmp_path: Path) -> None:
    task = _copy("harbor-hello", tmp_path)
    before = task_version(task)
    assert before == load_task(GOOD / "harbor-hello").version  # location-independent
    (task / "tests" / "__pycache__").mkdir()
    (task / "tests" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert task_version(task) == before
    _edit(task / "tests" / "test.sh", "HARBOR", "HARBOUR")
    changed = task_version(task)
    assert changed != before
    (task / "solution" / "extra.txt").write_text("")
    assert task_version(task) not in (before, changed)
    (task / "solution" / "extra.txt").rename(task / "solution" / "renamed.txt")
    assert len({before, changed, task_version(task)}) == 3


# --------------------------------------------------------------------------- suites


def test_load_suite_sorted() -> None:
    suite = load_suite(GOOD)
    assert isinstance(suite, Suite)
    assert (suite.name, suite.path, suite.ids) == (
        "good",
        GOOD,
        ["count-errors", "harbor-hello", "tb1-hello"],
    )
    assert len(suite) == 3 and suite.errors == ()
    assert suite.get("tb1-hello") is not None and suite.get("nope") is None


def test_broken_suite_fails_naming_every_broken_task() -> None:
    with pytest.raises(TaskFormatError) as info:
        load_suite(BROKEN)
    detail = info.value.detail
    assert detail.startswith("suite 'broken' (tasks/broken): 10 malformed tasks:\n")
    for folder in sorted(p.name for p in BROKEN.iterdir()):
        assert f"\n  tasks/broken/{folder}/" in detail
    assert info.value.field == "task.toml"  # the first one's: bad-toml


def test_collect_errors_keeps_going(tmp_path: Path) -> None:
    suite_dir = tmp_path / "mixed"
    shutil.copytree(GOOD / "harbor-hello", suite_dir / "a-good")
    shutil.copytree(BROKEN / "bad-type", suite_dir / "b-bad")
    (suite_dir / "_template").mkdir()  # skipped: starts with "_"
    (suite_dir / ".cache").mkdir()  # skipped: hidden
    suite = load_suite(suite_dir, collect_errors=True)
    assert suite.ids == ["a-good"]
    assert [e.field for e in suite.errors] == ["[agent].timeout_sec"]
    with pytest.raises(TaskFormatError, match=r"suite 'mixed' .*: 1 malformed task:\n  .*b-bad"):
        load_suite(suite_dir)


def test_discover_suites() -> None:
    suites = discover_suites(FIXTURES / "tasks", collect_errors=True)
    assert [s.name for s in suites] == [
        "broken",
        "foreign",
        "good",
        "hidden-tests",
        "in-process",
        "judge-state",
        "native-code",
        "tb2",
    ]
    assert len(suites[0].errors) == 10 and len(suites[1]) == 1 and len(suites[2]) == 3
    with pytest.raises(TaskFormatError, match="suite 'broken'"):
        discover_suites(FIXTURES / "tasks")
    with pytest.raises(TaskFormatError, match="not a tasks folder"):
        discover_suites(FIXTURES / "nowhere")


def test_bundled_terminal_suite_loads() -> None:
    suite = load_suite(BUNDLED / "terminal")
    assert len(suite) >= 20
    for task in suite:
        assert task.format == "harbor" and task.domain == "terminal", task.id
        assert task.solution_path is not None, task.id
        assert task.test_command == "bash /tests/test.sh", task.id
        assert task.expected_tests, task.id
        assert task.environment.context_dir is not None, task.id
        assert task.notes == (), (task.id, task.notes)
    assert len({t.version for t in suite}) == len(suite)


def test_bundled_root_discovers_terminal() -> None:
    names = [s.name for s in discover_suites(BUNDLED)]
    assert "terminal" in names


# --------------------------------------------------------------------------- registry


def _registry() -> TaskRegistry:
    return TaskRegistry([load_suite(GOOD)], image_prefix="crucible-test/unit")


def test_registry_get_and_list(tmp_path: Path) -> None:
    registry = _registry()
    assert registry.get("harbor-hello").key == "good/harbor-hello"
    assert registry.get("tb1-hello", suite="good").format == "tb1"
    assert registry.get("good/tb1-hello").id == "tb1-hello"
    assert [t.id for t in registry.list()] == ["count-errors", "harbor-hello", "tb1-hello"]
    assert registry.list(domain="document") == []
    assert [t.id for t in registry.list(suite="good", domain="terminal")] == [
        "count-errors",
        "harbor-hello",
        "tb1-hello",
    ]
    with pytest.raises(NotFound, match="unknown task 'nope'") as info:
        registry.get("nope")
    assert info.value.field == "task_id"
    with pytest.raises(NotFound, match="unknown suite 'other'; known: good"):
        registry.get("harbor-hello", suite="other")
    with pytest.raises(InvalidRequest, match="unknown domain 'robotics'"):
        registry.list(domain="robotics")

    other = tmp_path / "other"
    shutil.copytree(GOOD / "harbor-hello", other / "harbor-hello")
    registry.add_suite(load_suite(other))
    assert [s.name for s in registry.suites()] == ["good", "other"]
    with pytest.raises(InvalidRequest, match=r"in several suites \(good, other\)"):
        registry.get("harbor-hello")
    assert registry.get("harbor-hello", suite="other").suite == "other"
    assert [t.key for t in registry.list()][-1] == "other/harbor-hello"


def test_registry_from_root() -> None:
    registry = TaskRegistry.from_root(FIXTURES / "tasks", collect_errors=True)
    assert [s.name for s in registry.suites()] == [
        "broken",
        "foreign",
        "good",
        "hidden-tests",
        "in-process",
        "judge-state",
        "native-code",
        "tb2",
    ]
    assert len(registry.suite("broken").errors) == 10


def test_template_for_task() -> None:
    harbor = load_task(GOOD / "harbor-hello")
    template = template_for(harbor, "crucible-task/good-harbor-hello:0123456789ab")
    assert template.name == "task-good-harbor-hello"
    assert template.image == "crucible-task/good-harbor-hello:0123456789ab"
    assert (template.cpus, template.memory_mb, template.disk_mb) == (2.0, 1024, 2048)
    assert (template.network, template.workdir, template.files_root) == ("none", "/srv/work", "/")
    tb1 = _registry().template_for(load_task(GOOD / "tb1-hello"), "img:1")
    assert (tb1.name, tb1.network, tb1.workdir) == ("task-good-tb1-hello", "bridge", "/app")


def test_long_and_odd_names_fit_the_rules(tmp_path: Path) -> None:
    long_id = "A-Very_Long.Task" + "-x" * 40
    task = load_task(shutil.copytree(GOOD / "harbor-hello", tmp_path / "Suite_1" / long_id))
    name = template_name(task)
    assert len(name) <= 63 and name.startswith("task-suite_1-a-very_long.task-x-x")
    template_for(task, "img:1")  # passes Template's own name pattern
    twin = load_task(shutil.copytree(GOOD / "harbor-hello", tmp_path / "Suite_1" / (long_id + "y")))
    assert template_name(twin) != name
    assert image_repository(task) == f"crucible-task/suite-1-a-very-long-task{'-x' * 40}"
    assert image_repository(task, prefix="p/q") == f"p/q/suite-1-a-very-long-task{'-x' * 40}"


def test_ensure_image_builds_once_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    started = threading.Event()

    def fake_build(context_dir: Path, **kwargs: Any) -> str:
        calls.append({"context_dir": context_dir, **kwargs})
        started.wait(1)
        return f"{kwargs['repository']}:abc123abc123"

    monkeypatch.setattr(registry_module, "build_context", fake_build)
    registry = _registry()
    task = registry.get("harbor-hello")
    results: list[str] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(registry.ensure_image(task, base_image="base:1"))
        )
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    started.set()
    for t in threads:
        t.join()
    assert results == ["crucible-test/unit/good-harbor-hello:abc123abc123"] * 8
    assert len(calls) == 1
    call = calls[0]
    assert call["context_dir"] == GOOD / "harbor-hello" / "environment"
    assert call["base_image"] == "base:1" and call["build_args"] == {"BASE_IMAGE": "base:1"}
    assert call["labels"]["crucible.task"] == "good/harbor-hello"
    assert "crucible.build_settings" in call["labels"]  # the hash follows build settings
    assert registry.cached_image(task, base_image="base:1") == results[0]
    assert registry.cached_image(task, base_image="base:2") is None
    registry.ensure_image(task, base_image="base:2")  # another base: another build
    assert len(calls) == 2
    registry.clear_image_cache()
    registry.ensure_image(task, base_image="base:1")
    assert len(calls) == 3
