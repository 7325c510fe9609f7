"""Task models: the two on-disk formats as they are written, and the one ``Task`` Crucible runs.

File schemas (validated in pydantic strict mode: TOML and YAML carry types, so a string where
a number belongs is an error, never coerced):

* ``HarborTaskToml`` -- ``task.toml`` of the Harbor layout (Terminal-Bench 2). Unknown keys in
  Harbor's tables are accepted and ignored, as Harbor does; the loader lists them in
  ``Task.notes``. Crucible's own ``[crucible]`` table (``CrucibleSection``) forbids unknown keys,
  so a typo there fails instead of silently changing how a task is scored.
* ``TB1TaskYaml`` -- ``task.yaml`` of the Terminal-Bench 1 layout.

Both normalize into ``Task`` (see ``service.tasks.loader`` for the mapping). Units: seconds for
timeouts (``*_s``), MiB for ``memory_mb`` and ``storage_mb``, CPUs for ``cpus``.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.errors import TaskFormatError

USER_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$"

Domain = Literal["terminal", "document", "cad"]
TaskFormat = Literal["harbor", "tb1"]
RewardSource = Literal["reward_file", "exit_code"]

DOMAINS: tuple[str, ...] = ("terminal", "document", "cad")

#: Where a verifier puts a task's test files inside the verifying sandbox (Harbor and TB1 agree).
TESTS_MOUNT = "/tests"
#: Where Harbor's ``tests/test.sh`` writes ``reward.txt`` (a float) or ``reward.json``.
REWARD_DIR = "/logs/verifier"

# Harbor's defaults (``harbor.models.task.config``) where a table leaves a key out.
HARBOR_AGENT_TIMEOUT_S = 600.0
HARBOR_VERIFIER_TIMEOUT_S = 600.0
HARBOR_BUILD_TIMEOUT_S = 600.0
HARBOR_CPUS = 1.0
HARBOR_MEMORY_MB = 2048
HARBOR_STORAGE_MB = 10240
DEFAULT_WORKDIR = "/app"
MAX_MEMORY_MB = 256 * 1024  # service.templates.Template's limit

# Terminal-Bench 1's defaults (``terminal_bench.handlers.trial_handler.Task``).
TB1_AGENT_TIMEOUT_S = 360.0
TB1_TEST_TIMEOUT_S = 60.0

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG])(?:I?B?)?\s*$", re.IGNORECASE)
_VERIFIER_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def parse_size_mb(size: str) -> int:
    """A Harbor size string (``"512M"``, ``"2G"``, ``"1.5G"``, ``"4096K"``) in MiB.

    ``K``/``M``/``G`` are binary units (as in Harbor); a trailing ``i`` or ``B`` is tolerated.
    Raises ``ValueError`` for anything else.
    """
    match = _SIZE_RE.match(size)
    if not match:
        raise ValueError(
            f"invalid size {size!r}; expected a number and a unit, like '512M' or '2G'"
        )
    value, unit = float(match.group(1)), match.group(2).upper()
    factor = {"K": 1 / 1024, "M": 1, "G": 1024}[unit]
    return int(value * factor)


def check_workdir(value: str) -> str:
    """``value`` without a trailing slash if it is an absolute, normalized POSIX path.

    Raises ``ValueError`` for a relative path, ``.``/``..``/empty parts, or control characters.
    """
    path = value.rstrip("/") or "/"
    normalized = value.startswith("/") and not value.startswith("//")
    if (
        not normalized
        or posixpath.normpath(path) != path
        or any(ord(char) < 0x20 for char in value)
    ):
        raise ValueError(f"must be an absolute path without '..' or '.' parts (got {value!r})")
    return path


# --------------------------------------------------------------------------- file schemas


class _Table(BaseModel):
    """A Harbor table: strict types, unknown keys kept (and reported), never an error."""

    model_config = ConfigDict(strict=True, extra="allow")


class HarborAgentSection(_Table):
    """``[agent]``: ``timeout_sec`` is the episode's wall-clock budget in seconds."""

    timeout_sec: float | None = Field(None, gt=0)


class HarborVerifierSection(_Table):
    """``[verifier]``: ``timeout_sec`` bounds ``tests/test.sh``; ``env`` is passed to it.

    ``network`` (Crucible's): the verifier, never the agent, asks for the install's
    verifier network (``CRUCIBLE_VERIFIER_NETWORK``) so a ``test.sh`` can install its tools.
    """

    timeout_sec: float = Field(HARBOR_VERIFIER_TIMEOUT_S, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    network: bool = False


class HarborEnvironmentSection(_Table):
    """``[environment]``: the sandbox the agent works in.

    ``memory`` and ``storage`` are Harbor's older size strings (``"2G"``); when given they
    override ``memory_mb`` / ``storage_mb`` (as in Harbor). ``docker_image`` names a prebuilt
    image used instead of building ``environment/Dockerfile``.
    """

    build_timeout_sec: float = Field(HARBOR_BUILD_TIMEOUT_S, gt=0)
    docker_image: str | None = Field(None, min_length=1)
    cpus: float = Field(HARBOR_CPUS, gt=0, le=64)
    memory_mb: int = Field(HARBOR_MEMORY_MB, ge=16, le=MAX_MEMORY_MB)
    storage_mb: int = Field(HARBOR_STORAGE_MB, ge=16)
    memory: str | None = None
    storage: str | None = None
    gpus: int = Field(0, ge=0)
    allow_internet: bool = True
    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = Field(default_factory=dict)
    # Crucible's: the sandbox user (default root, as Harbor and Terminal-Bench tasks expect).
    user: str | None = Field(None, pattern=USER_NAME_PATTERN)
    uid: int | None = Field(None, ge=0, lt=1 << 31)
    gid: int | None = Field(None, ge=0, lt=1 << 31)
    allow_root: bool | None = None

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        return check_workdir(value)

    @field_validator("memory", "storage")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size_mb(value)
        return value


class CrucibleSection(BaseModel):
    """``[crucible]``: what Crucible adds to a task (unknown keys are an error here).

    ``verifier`` names the verifier (default: the domain's own); ``expected_tests`` is how many
    tests a run must report (fewer, or skips, do not pass); ``pass_threshold`` is the reward at
    or above which an episode counts as passed; ``settings`` is free-form, for the verifier.
    ``agent_code_in_judge``: what an outcome is worth when agent-written code ran inside the
    test process that reported it (the task's tests import the agent's code): ``"zero"``
    (the default: it is the agent's word, scored 0 with the cause) or ``"allow"`` (scored,
    and the record says ``details.trusted = false``). ``children_privileged``: the processes
    the tests start keep root's file-mode and user-switching capabilities (default off:
    they cannot read the hidden tests; a task whose tests run e.g. ``runuser`` turns it on).
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    domain: Domain = "terminal"
    verifier: str | None = None
    expected_tests: int | None = Field(None, ge=0)
    pass_threshold: float = Field(1.0, ge=0.0, le=1.0)
    settings: dict[str, Any] = Field(default_factory=dict)
    # an easier task of the same suite the scheduler runs instead after K failures in a row
    degrades_to: str | None = Field(None, min_length=1, max_length=200)
    agent_code_in_judge: Literal["zero", "allow"] = "zero"
    children_privileged: bool = False

    @field_validator("verifier")
    @classmethod
    def _verifier(cls, value: str | None) -> str | None:
        if value is not None and not _VERIFIER_NAME_RE.match(value):
            raise ValueError(f"must be a lowercase identifier like 'terminal' (got {value!r})")
        return value


class HarborTaskToml(_Table):
    """A Harbor ``task.toml``. ``version`` is the schema version string (``"1.0"``)."""

    version: str = "1.0"
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent: HarborAgentSection = Field(default_factory=HarborAgentSection)
    verifier: HarborVerifierSection = Field(default_factory=HarborVerifierSection)
    environment: HarborEnvironmentSection = Field(default_factory=HarborEnvironmentSection)
    crucible: CrucibleSection = Field(default_factory=CrucibleSection)

    @model_validator(mode="before")
    @classmethod
    def _schema_version(cls, data: Any) -> Any:
        # Newer Harbor writes ``schema_version``; older ``version``. Either names the schema.
        if isinstance(data, dict) and "schema_version" in data and "version" not in data:
            data = {**data, "version": data["schema_version"]}
            del data["schema_version"]
        return data


class TB1TaskYaml(BaseModel):
    """A Terminal-Bench 1 ``task.yaml``.

    ``instruction`` is the prompt (very old tasks carry ``descriptions: [{key: base,
    description: ...}]`` instead; the loader accepts that). ``max_test_timeout_sec`` bounds
    ``run-tests.sh``. Unknown keys are ignored and reported, like Harbor's tables. An optional
    ``crucible:`` mapping has the schema of Harbor's ``[crucible]`` table.
    """

    model_config = ConfigDict(strict=True, extra="allow")

    instruction: str | None = None
    descriptions: list[dict[str, Any]] | None = None
    author_name: str = "unknown"
    author_email: str = "unknown"
    difficulty: str = "unknown"
    category: str = "software_engineering"
    tags: list[str] = Field(default_factory=list)
    parser_name: str = "pytest"
    max_agent_timeout_sec: float = Field(TB1_AGENT_TIMEOUT_S, gt=0)
    max_test_timeout_sec: float = Field(TB1_TEST_TIMEOUT_S, gt=0)
    run_tests_in_same_shell: bool = False
    disable_asciinema: bool = False
    env_name: str | None = None
    estimated_duration_sec: float | None = None
    expert_time_estimate_min: float | None = None
    junior_time_estimate_min: float | None = None
    crucible: CrucibleSection = Field(default_factory=CrucibleSection)


# --------------------------------------------------------------------------- the normalized task


class TaskEnvironment(BaseModel):
    """The sandbox a task runs in: limits, network, workdir, sandbox user, and how its image
    is made.

    Sandbox user (``[environment]`` ``user``, ``uid``, ``gid``, ``allow_root``): none given is
    root; ``uid`` (``gid`` defaults to it) is a non-root user by number, ``user`` alone a name
    looked up in the built image's ``/etc/passwd`` (``TaskRegistry.template_for``).
    ``allow_root`` lets requests run as another user (default: only root tasks do).

    Exactly one of ``context_dir`` (a folder with a ``Dockerfile``, built on a Crucible sandbox
    image passed as ``ARG BASE_IMAGE``) and ``docker_image`` (a prebuilt image) is set.
    ``build_timeout_s`` is the task's declared image build budget in seconds.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(gt=0, le=64)
    memory_mb: int = Field(ge=16, le=MAX_MEMORY_MB)
    storage_mb: int = Field(ge=16)
    gpus: int = Field(0, ge=0)
    allow_internet: bool
    workdir: str
    build_timeout_s: float = Field(gt=0)
    context_dir: Path | None = None
    docker_image: str | None = None
    dockerfile: str = "Dockerfile"
    user: str | None = Field(None, pattern=USER_NAME_PATTERN)
    uid: int | None = Field(None, ge=0, lt=1 << 31)
    gid: int | None = Field(None, ge=0, lt=1 << 31)
    allow_root: bool | None = None

    @model_validator(mode="after")
    def _one_image_source(self) -> TaskEnvironment:
        if (self.context_dir is None) == (self.docker_image is None):
            raise ValueError("exactly one of context_dir and docker_image must be set")
        return self

    @model_validator(mode="after")
    def _user_is_consistent(self) -> TaskEnvironment:
        if self.gid is not None and self.uid is None:
            raise ValueError("gid needs uid")
        if self.user == "root" and self.uid not in (None, 0):
            raise ValueError("user root is uid 0")
        if self.uid == 0 and self.user not in (None, "root"):
            raise ValueError("uid 0 is root")
        return self


class Task(BaseModel):
    """One task, whatever format it was written in.

    Identity: ``id`` (the folder name), ``suite`` (the suite folder's name), ``path`` (the task
    folder), ``format`` (``harbor`` or ``tb1``), ``version`` (16 hex digits of a sha256 over
    every file of the task: relative path and bytes, sorted; records name what was run).

    Episode: ``instruction`` (the prompt text), ``agent_timeout_s``, ``environment``.

    Verification: the verifier copies the contents of ``tests_dir`` (and ``test_script`` when
    it lies outside it, as TB1's ``run-tests.sh`` does) to ``/tests`` in a fresh sandbox forked
    from the episode's end state, then runs ``test_command`` with ``test_env`` for at most
    ``verifier_timeout_s`` seconds (``test_command`` is None for a verifier that scores in
    Crucible itself, e.g. a document task's field comparison). ``reward_source`` says where
    the reward comes from: ``reward_file`` (Harbor: ``/logs/verifier/reward.txt`` holds a
    float, or ``reward.json`` a dict of floats) or ``exit_code`` (TB1, which has no reward
    file: exit status 0 is reward 1.0, anything else 0.0; the pytest ``-rA`` summary in the
    output gives the per-test counts that ``expected_tests`` is checked against).
    ``verifier_network``: the task asks for the install's verifier network
    (``[verifier] network = true``). ``pass_threshold``: a reward at or above it counts as
    passed. ``verifier`` and ``verifier_settings`` select and configure the verifier.
    ``degrades_to``: the easier task of the same suite a job runs instead after repeated
    failures (``[crucible] degrades_to``; see ``service.scheduler``). ``agent_code_in_judge``,
    ``children_privileged``: the ``[crucible]`` keys of the same names (``CrucibleSection``).

    ``solution_path`` is the oracle script (None when the task has none Crucible can run);
    ``notes`` lists what the loader accepted but ignored or could not honour.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    suite: str
    path: Path
    format: TaskFormat
    domain: Domain
    version: str = Field(pattern=r"^[0-9a-f]{16}$")
    instruction: str
    agent_timeout_s: float = Field(gt=0)
    verifier_timeout_s: float = Field(gt=0)
    environment: TaskEnvironment
    solution_path: Path | None
    tests_dir: Path | None
    test_script: Path | None
    test_command: str | None
    test_env: dict[str, str] = Field(default_factory=dict)
    verifier_network: bool = False
    reward_source: RewardSource
    verifier: str
    verifier_settings: dict[str, Any] = Field(default_factory=dict)
    expected_tests: int | None = None
    pass_threshold: float = Field(1.0, ge=0.0, le=1.0)
    degrades_to: str | None = None
    agent_code_in_judge: Literal["zero", "allow"] = "zero"
    children_privileged: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """``<suite>/<id>``: unique across a registry."""
        return f"{self.suite}/{self.id}"

    @property
    def environment_dir(self) -> Path | None:
        """The image build context (None when the task uses a prebuilt ``docker_image``)."""
        return self.environment.context_dir


@dataclass(frozen=True)
class Suite:
    """A folder of tasks. ``tasks`` are sorted by id; ``errors`` holds the tasks that failed to
    load when the suite was loaded with ``collect_errors=True`` (else it is always empty).
    """

    name: str
    path: Path
    tasks: tuple[Task, ...] = ()
    errors: tuple[TaskFormatError, ...] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def ids(self) -> list[str]:
        """The task ids, sorted."""
        return [t.id for t in self.tasks]

    def get(self, task_id: str) -> Task | None:
        """The task with this id, or None."""
        return next((t for t in self.tasks if t.id == task_id), None)
