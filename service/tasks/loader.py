"""Load task folders (Harbor or Terminal-Bench 1 layout) into ``Task`` and suites of them.

Harbor layout (Terminal-Bench 2)::

    <id>/task.toml              version, [metadata], [agent], [verifier], [environment], [crucible]
    <id>/instruction.md         the prompt
    <id>/environment/Dockerfile (+ files; not needed with [environment].docker_image)
    <id>/solution/solve.sh      the oracle
    <id>/tests/test.sh          (+ files) writes /logs/verifier/reward.txt or reward.json

Terminal-Bench 1 layout::

    <id>/task.yaml              instruction (inline), metadata, max_*_timeout_sec, ...
    <id>/Dockerfile             at the task root (the root is the build context)
    <id>/docker-compose.yaml    ignored: Crucible runs one sandbox from the Dockerfile
    <id>/solution.sh            the oracle (solution.yaml keystroke scripts are not supported)
    <id>/run-tests.sh           run with tests/ copied to $TEST_DIR=/tests
    <id>/tests/                 test_outputs.py, ...

How TB1 maps onto Crucible: TB1 copies ``run-tests.sh`` and ``tests/`` into ``/tests``, sets
``TEST_DIR=/tests``, runs ``bash /tests/run-tests.sh`` in the workdir and parses pytest's
``-rA`` summary; it writes no reward file. Crucible does the same copy and command, and takes
the reward from the exit status (``reward_source="exit_code"``: 0 -> 1.0, else 0.0; the same
rule as Harbor's TB1 importer), with the pytest summary used for the ``expected_tests`` check.
TB1 has no resource settings: Harbor's defaults apply (1 CPU, 2048 MiB, 10240 MiB storage,
internet allowed, since TB1 containers had network and its ``run-tests.sh`` installs ``uv``),
and the workdir is the Dockerfile's last ``WORKDIR`` (``/app`` when it has none).

Errors: every problem raises ``TaskFormatError`` whose message starts with the file (shown
relative to the current directory when inside it) and names the field, e.g.
``tasks/terminal/foo/task.toml: [agent].timeout_sec: Input should be a valid number``.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from service.errors import TaskFormatError
from service.tasks.models import (
    DEFAULT_WORKDIR,
    HARBOR_AGENT_TIMEOUT_S,
    HARBOR_BUILD_TIMEOUT_S,
    HARBOR_CPUS,
    HARBOR_MEMORY_MB,
    HARBOR_STORAGE_MB,
    TESTS_MOUNT,
    CrucibleSection,
    HarborTaskToml,
    Suite,
    Task,
    TaskEnvironment,
    TB1TaskYaml,
    check_workdir,
    parse_size_mb,
)

HARBOR_CONFIG = "task.toml"
TB1_CONFIG = "task.yaml"
VERSION_LEN = 16

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_HARBOR_TABLES = frozenset({"metadata", "agent", "verifier", "environment", "crucible"})
_COPY_RE = re.compile(r"^\s*(?:COPY|ADD)\s+(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_LEAKY_SOURCES = ("tests", "run-tests.sh", "solution")
_WORKDIR_RE = re.compile(r"^\s*WORKDIR\s+(\S.*?)\s*$", re.IGNORECASE | re.MULTILINE)
# Not part of a task: byte-code and desktop litter that running tests locally leaves behind.
_IGNORED_DIRS = frozenset({"__pycache__", ".pytest_cache"})
_IGNORED_SUFFIXES = (".pyc", ".pyo")
_IGNORED_FILES = frozenset({".DS_Store"})


# --------------------------------------------------------------------------- public API


def load_task(path: str | Path, *, suite: str | None = None) -> Task:
    """Load one task folder (Harbor ``task.toml`` or TB1 ``task.yaml``) into a ``Task``.

    ``suite`` defaults to the name of the folder that holds the task. When both config files
    exist, ``task.toml`` wins (noted in ``Task.notes``).

    Raises ``TaskFormatError`` (message: file, field, reason) for a missing folder or file,
    unparsable TOML/YAML (with the line), a value of the wrong type or out of range, an unknown
    domain, a bad workdir, an empty instruction.
    """
    task_dir = Path(path).absolute()
    if not task_dir.is_dir():
        raise TaskFormatError(f"{_show(task_dir)}: not a task folder (missing)", field="path")
    task_id = task_dir.name
    suite_name = suite if suite is not None else task_dir.parent.name
    if not _NAME_RE.match(task_id):
        raise TaskFormatError(
            f"{_show(task_dir)}: task folder name {task_id!r} must be letters, digits, '.', "
            "'_' or '-' (starting with a letter or digit)",
            field="id",
        )
    toml_path, yaml_path = task_dir / HARBOR_CONFIG, task_dir / TB1_CONFIG
    if toml_path.is_file():
        notes: list[str] = []
        if yaml_path.exists():
            notes.append(f"{TB1_CONFIG} ignored: {HARBOR_CONFIG} takes precedence")
        return _load_harbor(task_dir, task_id=task_id, suite=suite_name, notes=notes)
    if yaml_path.is_file():
        return _load_tb1(task_dir, task_id=task_id, suite=suite_name)
    raise TaskFormatError(
        f"{_show(toml_path)}: missing (a task folder needs {HARBOR_CONFIG} or {TB1_CONFIG})",
        field=HARBOR_CONFIG,
    )


def load_suite(path: str | Path, *, collect_errors: bool = False) -> Suite:
    """Load every task folder of a suite folder, sorted by id.

    Task folders are the sub-folders whose names do not start with ``.`` or ``_`` (so
    ``_template/`` is skipped). The suite's name is the folder's name.

    Raises ``TaskFormatError`` when the folder is missing, or when any task is malformed: the
    message names the suite and every malformed task's file and field. With ``collect_errors``
    malformed tasks are skipped instead and their errors kept in ``Suite.errors``.
    """
    suite_dir = Path(path).absolute()
    if not suite_dir.is_dir():
        raise TaskFormatError(f"{_show(suite_dir)}: not a suite folder (missing)", field="suite")
    tasks: list[Task] = []
    errors: list[TaskFormatError] = []
    for task_dir in _subfolders(suite_dir):
        try:
            tasks.append(load_task(task_dir, suite=suite_dir.name))
        except TaskFormatError as exc:
            errors.append(exc)
    if errors and not collect_errors:
        count = f"{len(errors)} malformed task{'s' * (len(errors) != 1)}"
        lines = "\n".join(f"  {e.detail}" for e in errors)
        raise TaskFormatError(
            f"suite {suite_dir.name!r} ({_show(suite_dir)}): {count}:\n{lines}",
            field=errors[0].field,
        ) from errors[0]
    return Suite(name=suite_dir.name, path=suite_dir, tasks=tuple(tasks), errors=tuple(errors))


def discover_suites(root: str | Path, *, collect_errors: bool = False) -> list[Suite]:
    """Load every suite folder under ``root`` (e.g. ``tasks/``), sorted by name.

    Raises ``TaskFormatError`` when ``root`` is missing or (unless ``collect_errors``) when a
    suite has a malformed task, as ``load_suite`` does.
    """
    root_dir = Path(root).absolute()
    if not root_dir.is_dir():
        raise TaskFormatError(f"{_show(root_dir)}: not a tasks folder (missing)", field="root")
    return [load_suite(d, collect_errors=collect_errors) for d in _subfolders(root_dir)]


def task_version(path: str | Path) -> str:
    """16 hex digits of a sha256 over every file of a task folder (relative path + bytes).

    Files are taken in sorted path order; a symlink counts as its target text (never
    followed); ``__pycache__``/``.pytest_cache`` folders, ``*.pyc`` and ``.DS_Store`` are
    left out, since running tests locally leaves them behind.
    """
    root = Path(path)
    digest = hashlib.sha256(b"crucible-task-v1\0")
    for file in _task_files(root):
        rel = file.relative_to(root).as_posix().encode()
        if file.is_symlink():
            digest.update(b"L\0" + rel + b"\0" + os.readlink(file).encode() + b"\0")
            continue
        digest.update(b"F\0" + rel + b"\0%d\0" % file.stat().st_size)
        with file.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:VERSION_LEN]


# --------------------------------------------------------------------------- Harbor


def _load_harbor(task_dir: Path, *, task_id: str, suite: str, notes: list[str]) -> Task:
    config_path = task_dir / HARBOR_CONFIG
    data = _parse_toml(config_path)
    try:
        config = HarborTaskToml.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(config_path, exc, tables=True) from None
    notes.extend(_unknown_keys_harbor(config))
    env = config.environment

    instruction = _read_instruction(task_dir / "instruction.md")

    docker_image = env.docker_image
    context_dir: Path | None = None
    dockerfile = task_dir / "environment" / "Dockerfile"
    if docker_image is not None:
        if dockerfile.exists():
            notes.append("environment/Dockerfile ignored: [environment].docker_image is set")
    elif dockerfile.is_file():
        context_dir = dockerfile.parent
    else:
        raise TaskFormatError(
            f"{_show(dockerfile)}: missing (or set [environment].docker_image in {HARBOR_CONFIG})",
            field="environment.Dockerfile",
        )

    crucible = config.crucible
    verifier = crucible.verifier or crucible.domain
    tests_dir = task_dir / "tests"
    test_script = tests_dir / "test.sh"
    if not test_script.is_file():
        if verifier == "terminal":
            raise TaskFormatError(f"{_show(test_script)}: missing", field="tests/test.sh")
        test_script_or_none: Path | None = None
    else:
        test_script_or_none = test_script

    solution = task_dir / "solution" / "solve.sh"
    if not solution.is_file():
        notes.append("solution/solve.sh missing: the task has no oracle")

    memory_mb = parse_size_mb(env.memory) if env.memory is not None else env.memory_mb
    storage_mb = parse_size_mb(env.storage) if env.storage is not None else env.storage_mb
    if env.gpus:
        notes.append(f"[environment].gpus = {env.gpus} ignored: Crucible sandboxes have no GPUs")
    if env.env:
        notes.append("[environment].env ignored: host variables are never passed into a sandbox")
    environment = _environment(
        config_path,
        tables=True,
        cpus=env.cpus,
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        gpus=env.gpus,
        allow_internet=env.allow_internet,
        workdir=env.workdir,
        build_timeout_s=env.build_timeout_sec,
        context_dir=context_dir,
        docker_image=docker_image,
        user=env.user,
        uid=env.uid,
        gid=env.gid,
        allow_root=env.allow_root,
    )
    return Task(
        id=task_id,
        suite=suite,
        path=task_dir,
        format="harbor",
        domain=crucible.domain,
        version=task_version(task_dir),
        instruction=instruction,
        agent_timeout_s=config.agent.timeout_sec or HARBOR_AGENT_TIMEOUT_S,
        verifier_timeout_s=config.verifier.timeout_sec,
        environment=environment,
        solution_path=solution if solution.is_file() else None,
        tests_dir=tests_dir if tests_dir.is_dir() else None,
        test_script=test_script_or_none,
        test_command=f"bash {TESTS_MOUNT}/test.sh" if test_script_or_none else None,
        test_env=dict(config.verifier.env),
        verifier_network=config.verifier.network,
        reward_source="reward_file",
        verifier=verifier,
        verifier_settings=dict(crucible.settings),
        expected_tests=crucible.expected_tests,
        pass_threshold=crucible.pass_threshold,
        degrades_to=crucible.degrades_to,
        agent_code_in_judge=crucible.agent_code_in_judge,
        children_privileged=crucible.children_privileged,
        metadata=dict(config.metadata),
        notes=tuple(notes),
    )


def _unknown_keys_harbor(config: HarborTaskToml) -> list[str]:
    notes = [f"{HARBOR_CONFIG}: unknown key {key!r} ignored" for key in config.model_extra or {}]
    for table in ("agent", "verifier", "environment"):
        section = getattr(config, table)
        for key in section.model_extra or {}:
            notes.append(f"{HARBOR_CONFIG}: unknown key [{table}].{key} ignored")
    return notes


# --------------------------------------------------------------------------- Terminal-Bench 1


def _load_tb1(task_dir: Path, *, task_id: str, suite: str) -> Task:
    config_path = task_dir / TB1_CONFIG
    data = _parse_yaml(config_path)
    try:
        config = TB1TaskYaml.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(config_path, exc, tables=False) from None
    notes = [f"{TB1_CONFIG}: unknown key {key!r} ignored" for key in config.model_extra or {}]

    instruction = _tb1_instruction(config_path, config)

    dockerfile = task_dir / "Dockerfile"
    if not dockerfile.is_file():
        if config.env_name:
            raise TaskFormatError(
                f"{_show(config_path)}: env_name: shared TB1 environments are not supported; "
                "give the task its own Dockerfile",
                field="env_name",
            )
        raise TaskFormatError(f"{_show(dockerfile)}: missing", field="Dockerfile")
    if _copies_tests_or_solution(dockerfile):
        notes.append(
            "Dockerfile copies tests, run-tests.sh or the solution into the image (the task "
            "root is the build context): the agent can read them"
        )
    for compose_name in ("docker-compose.yaml", "docker-compose.yml"):
        if (task_dir / compose_name).is_file():
            notes.append(_compose_note(task_dir / compose_name))

    solution = task_dir / "solution.sh"
    if not solution.is_file():
        if (task_dir / "solution.yaml").is_file():
            notes.append(
                "solution.yaml is not supported (a TB1 keystroke script for an interactive "
                "terminal): the task has no oracle Crucible can run; convert it to solution.sh"
            )
        else:
            notes.append("solution.sh missing: the task has no oracle")

    tests_dir = task_dir / "tests"
    run_tests = task_dir / "run-tests.sh"
    workdir = _dockerfile_workdir(dockerfile)
    if run_tests.is_file():
        test_script: Path | None = run_tests
        test_command = f"bash {TESTS_MOUNT}/run-tests.sh"
    elif (tests_dir / "test_outputs.py").is_file():
        # TB1 falls back to its template run-tests.sh, which runs pytest on test_outputs.py.
        test_script = None
        test_command = f"python3 -m pytest -rA {TESTS_MOUNT}/test_outputs.py"
        notes.append("run-tests.sh missing: running pytest on tests/test_outputs.py")
    else:
        raise TaskFormatError(f"{_show(run_tests)}: missing", field="run-tests.sh")
    if config.parser_name != "pytest":
        notes.append(
            f"parser_name {config.parser_name!r}: Crucible reads only the exit status and a "
            "pytest summary"
        )
    if config.run_tests_in_same_shell:
        notes.append(
            "run_tests_in_same_shell ignored: Crucible always verifies in a fresh sandbox "
            "forked from the episode's end state"
        )

    crucible: CrucibleSection = config.crucible
    environment = _environment(
        config_path,
        tables=False,
        cpus=HARBOR_CPUS,
        memory_mb=HARBOR_MEMORY_MB,
        storage_mb=HARBOR_STORAGE_MB,
        gpus=0,
        allow_internet=True,
        workdir=workdir,
        build_timeout_s=HARBOR_BUILD_TIMEOUT_S,
        context_dir=task_dir,
        docker_image=None,
    )
    metadata_keys = (
        "author_name",
        "author_email",
        "difficulty",
        "category",
        "tags",
        "parser_name",
        "run_tests_in_same_shell",
        "disable_asciinema",
        "estimated_duration_sec",
        "expert_time_estimate_min",
        "junior_time_estimate_min",
    )
    metadata = {k: getattr(config, k) for k in metadata_keys if getattr(config, k) is not None}
    return Task(
        id=task_id,
        suite=suite,
        path=task_dir,
        format="tb1",
        domain=crucible.domain,
        version=task_version(task_dir),
        instruction=instruction,
        agent_timeout_s=config.max_agent_timeout_sec,
        verifier_timeout_s=config.max_test_timeout_sec,
        environment=environment,
        solution_path=solution if solution.is_file() else None,
        tests_dir=tests_dir if tests_dir.is_dir() else None,
        test_script=test_script,
        test_command=test_command,
        test_env={"TEST_DIR": TESTS_MOUNT},
        reward_source="exit_code",
        verifier=crucible.verifier or crucible.domain,
        verifier_settings=dict(crucible.settings),
        expected_tests=crucible.expected_tests,
        pass_threshold=crucible.pass_threshold,
        degrades_to=crucible.degrades_to,
        agent_code_in_judge=crucible.agent_code_in_judge,
        children_privileged=crucible.children_privileged,
        metadata=metadata,
        notes=tuple(notes),
    )


def _tb1_instruction(config_path: Path, config: TB1TaskYaml) -> str:
    text = config.instruction
    if text is None and config.descriptions:
        # Early TB1: descriptions: [{key: base, description: ...}, ...]; "base" is the prompt.
        base = next((d for d in config.descriptions if d.get("key") == "base"), None)
        chosen = base or config.descriptions[0]
        value = chosen.get("description")
        text = value if isinstance(value, str) else None
    if text is None:
        raise TaskFormatError(
            f"{_show(config_path)}: instruction: Field required", field="instruction"
        )
    if not text.strip():
        raise TaskFormatError(f"{_show(config_path)}: instruction: empty", field="instruction")
    return text


def _compose_note(compose: Path) -> str:
    note = f"{compose.name} ignored: Crucible runs one sandbox built from the Dockerfile"
    try:
        import yaml

        data = yaml.safe_load(compose.read_text(encoding="utf-8"))
        services = data.get("services") if isinstance(data, dict) else None
        if isinstance(services, dict) and len(services) > 1:
            note += f" (it declares {len(services)} services; only one is emulated)"
    except Exception:  # the note is advisory; a broken compose file changes nothing we run
        note += " (unreadable)"
    return note


def _copies_tests_or_solution(dockerfile: Path) -> bool:
    """Whether a TB1 Dockerfile COPYs/ADDs the whole root, tests, run-tests.sh or a solution."""
    text = dockerfile.read_text(encoding="utf-8", errors="replace")
    for match in _COPY_RE.finditer(text):
        args = [a for a in match.group(1).split() if not a.startswith("--")]
        for source in args[:-1]:  # the last argument is the destination
            source = source.strip("\"'[],").removeprefix("./").rstrip("/")
            if source in ("", ".", "*") or source.startswith(_LEAKY_SOURCES):
                return True
    return False


def _dockerfile_workdir(dockerfile: Path) -> str:
    """The Dockerfile's last absolute ``WORKDIR`` without variables, else ``/app``."""
    text = dockerfile.read_text(encoding="utf-8", errors="replace")
    for raw in reversed(_WORKDIR_RE.findall(text)):
        value = raw.strip().strip("\"'")
        if "$" in value:
            break
        try:
            return check_workdir(value)
        except ValueError:
            break
    return DEFAULT_WORKDIR


# --------------------------------------------------------------------------- shared helpers


def _environment(config_path: Path, *, tables: bool, **fields: Any) -> TaskEnvironment:
    try:
        return TaskEnvironment(**fields)
    except ValidationError as exc:  # e.g. a `memory = "300G"` string past the memory limit
        raise _validation_error(config_path, exc, tables=tables, prefix="environment") from None


def _read_instruction(path: Path) -> str:
    if not path.is_file():
        raise TaskFormatError(f"{_show(path)}: missing", field="instruction.md")
    text = _read_text(path)
    if not text.strip():
        raise TaskFormatError(f"{_show(path)}: empty", field="instruction.md")
    return text


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskFormatError(
            f"{_show(path)}: not valid UTF-8 (byte {exc.start})", field=path.name
        ) from None
    except OSError as exc:
        raise TaskFormatError(
            f"{_show(path)}: unreadable ({exc.strerror})", field=path.name
        ) from None


def _parse_toml(path: Path) -> dict[str, Any]:
    text = _read_text(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        reason = str(exc)  # "... (at line 3, column 5)" or "... (at end of document)"
        last_line = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        reason = reason.replace("(at end of document)", f"(at end of document, line {last_line})")
        raise TaskFormatError(f"{_show(path)}: invalid TOML: {reason}", field=path.name) from None


def _parse_yaml(path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a dependency
        raise TaskFormatError(
            f"{_show(path)}: reading Terminal-Bench 1 tasks needs PyYAML (pip install pyyaml)",
            field=path.name,
        ) from None
    text = _read_text(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise TaskFormatError(
            f"{_show(path)}: invalid YAML{where}: {problem}", field=path.name
        ) from None
    if not isinstance(data, dict):
        kind = "nothing" if data is None else type(data).__name__
        raise TaskFormatError(
            f"{_show(path)}: expected a mapping of keys at the top level, got {kind}",
            field=path.name,
        )
    return data


def _validation_error(
    path: Path, exc: ValidationError, *, tables: bool, prefix: str | None = None
) -> TaskFormatError:
    """One ``TaskFormatError`` listing every error as ``<field>: <message>``."""
    parts: list[str] = []
    fields: list[str] = []
    for error in exc.errors(include_url=False):
        loc = (prefix, *error["loc"]) if prefix else error["loc"]
        name = _field_name(loc, tables=tables)
        ctx = error.get("ctx") or {}
        message = str(ctx["error"]) if error["type"] == "value_error" else error["msg"]
        parts.append(f"{name}: {message}")
        fields.append(name)
    return TaskFormatError(
        f"{_show(path)}: {'; '.join(parts)}", field=fields[0] if fields else None
    )


def _field_name(loc: Sequence[str | int], *, tables: bool) -> str:
    """``("agent", "timeout_sec")`` -> ``[agent].timeout_sec`` (TOML) or ``agent.timeout_sec``."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i == 0 and tables and part in _HARBOR_TABLES:
            out = f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(root)"


def _show(path: Path) -> str:
    """``path`` relative to the current directory when inside it, else absolute."""
    absolute = Path(path).absolute()
    try:
        return absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return absolute.as_posix()


def _subfolders(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def _task_files(root: Path) -> list[Path]:
    """Regular files and symlinks under ``root`` (symlinks never followed), sorted by path."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        links = [d for d in dirnames if (here / d).is_symlink()]
        dirnames[:] = [d for d in dirnames if d not in _IGNORED_DIRS]
        for name in [*filenames, *links]:
            if name in _IGNORED_FILES or name.endswith(_IGNORED_SUFFIXES):
                continue
            mode = (here / name).lstat().st_mode
            if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                found.append(here / name)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())
