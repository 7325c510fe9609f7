"""The client's own models (``policy_client.schemas``) are pinned to the server's: every
client model has a server model of the same name, and the two have the same fields, types,
required-ness and defaults (their JSON Schemas, with value bounds and documentation set
aside), so the client-only install cannot drift from the API it talks to."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError, create_model

import service.api.processes
import service.api.rewards
import service.api.sessions
import service.rewards
import service.schemas
from policy_client import schemas

SERVER_MODULES = (
    service.schemas,
    service.rewards,
    service.api.rewards,
    service.api.sessions,
    service.api.processes,
)

# Bounds and prose are the server's to enforce and document; the extra-field policy differs
# on purpose (client answers ignore unknown fields, the server forbids them).
BOUNDS_AND_PROSE = {
    "title",
    "description",
    "examples",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "pattern",
    "multipleOf",
}


def _client_models() -> dict[str, type[BaseModel]]:
    return {
        name: obj
        for name, obj in vars(schemas).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseModel)
        and obj.__module__ == schemas.__name__
        and not name.startswith("_")
    }


def _server_model(name: str) -> type[BaseModel] | None:
    for module in SERVER_MODULES:
        obj = getattr(module, name, None)
        if inspect.isclass(obj) and issubclass(obj, BaseModel):
            return obj
    return None


def _normalized(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: _normalized(v)
            for k, v in node.items()
            if k not in BOUNDS_AND_PROSE and not (k == "additionalProperties" and v is False)
        }
    if isinstance(node, list):
        return [_normalized(v) for v in node]
    return node


def _shape(model: type[BaseModel], mode: str) -> dict[str, Any]:
    shape = _normalized(model.model_json_schema(mode=mode))  # type: ignore[arg-type]
    shape["required"] = sorted(shape.get("required", []))
    for sub in shape.get("$defs", {}).values():
        sub["required"] = sorted(sub.get("required", []))
    return shape


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two normalized schemas differ, as ``path: left != right`` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            where = f"{path}.{key}" if path else key
            if key not in a or key not in b:
                out.append(f"{where}: {a.get(key, '<absent>')!r} != {b.get(key, '<absent>')!r}")
            else:
                out.extend(_differences(a[key], b[key], where))
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _model_differences(client: type[BaseModel], server: type[BaseModel]) -> list[str]:
    return [
        f"{mode}: {line}"
        for mode in ("validation", "serialization")
        for line in _differences(_shape(client, mode), _shape(server, mode))
    ]


CLIENT_MODELS = _client_models()


def test_the_client_owns_the_models_its_calls_answer_with() -> None:
    # The models the SDK validates answers with and sends (not an empty module).
    expected = {
        "SandboxOut",
        "SandboxList",
        "ExecOut",
        "FileOut",
        "SnapshotOut",
        "ForkOut",
        "TemplateOut",
        "TaskOut",
        "TaskList",
        "EpisodeOut",
        "EpisodeGroupOut",
        "VerifyIn",
        "JobOut",
        "WorkItemOut",
        "RewardRecord",
        "RewardPage",
    }
    assert expected <= set(CLIENT_MODELS)


def test_every_client_model_has_a_server_model_of_its_name() -> None:
    missing = [name for name in CLIENT_MODELS if _server_model(name) is None]
    assert missing == []


@pytest.mark.parametrize("name", sorted(CLIENT_MODELS))
def test_client_model_matches_the_server(name: str) -> None:
    server = _server_model(name)
    assert server is not None
    assert _model_differences(CLIENT_MODELS[name], server) == []


def _mutants() -> list[tuple[str, type[BaseModel]]]:
    base = schemas.ExecOut
    fields: dict[str, Any] = {
        n: (f.annotation, f) for n, f in base.model_fields.items() if n != "exit_code"
    }
    timed_out = {n: v for n, v in fields.items() if n != "timed_out"}
    return [
        ("renamed", create_model("ExecOut", **fields, exit_status=(int, ...))),
        ("retyped", create_model("ExecOut", **fields, exit_code=(str, ...))),
        ("made optional", create_model("ExecOut", **fields, exit_code=(int | None, None))),
        ("dropped", create_model("ExecOut", **fields)),
        (
            "new default",
            create_model("ExecOut", **timed_out, exit_code=(int, ...), timed_out=(bool, True)),
        ),
        ("added", create_model("ExecOut", **fields, exit_code=(int, ...), extra=(int, 0))),
    ]


@pytest.mark.parametrize(("what", "mutant"), _mutants(), ids=[m[0] for m in _mutants()])
def test_the_comparison_sees_every_kind_of_drift(what: str, mutant: type[BaseModel]) -> None:
    assert _model_differences(mutant, service.schemas.ExecOut) != [], what


def test_answers_ignore_unknown_fields_and_requests_refuse_them() -> None:
    listed = schemas.SnapshotOut.model_validate(
        {
            "id": "snap_1",
            "sandbox_id": "sb_1",
            "template": "terminal",
            "created_at": "2026-01-01T00:00:00Z",
            "added_by_a_newer_server": 1,
        }
    )
    assert listed.id == "snap_1"
    with pytest.raises(ValidationError, match="polcy"):
        schemas.VerifyIn.model_validate({"policy": {"name": "p"}, "polcy": {}})


def test_a_server_record_reads_as_a_client_record() -> None:
    record = service.rewards.RewardRecord(
        episode_id="ep_1",
        group_id="g_1",
        sample_idx=0,
        task_id="t",
        task_version="1",
        suite="s",
        domain="terminal",
        template="terminal",
        image_digest="sha256:0",
        policy={"name": "p", "version": "1"},
        reward=1.0,
        verifier={"name": "v", "version": "1", "status": "ok"},
        stop_reason="complete",
        response_ids=[5, 6],
        loss_mask=[1, 0],
        sandbox_id="sb_1",
    )
    mine = schemas.RewardRecord.model_validate_json(record.model_dump_json())
    assert mine.model_dump(mode="json") == record.model_dump(mode="json")
    assert mine.is_valid and mine.loss_mask == [1, 0]
    old = {**record.model_dump(mode="json"), "schema_version": "1"}
    assert schemas.RewardRecord.model_validate(old).schema_version == "2"


def test_importing_the_client_imports_no_server_code() -> None:
    code = (
        "import sys, policy_client, policy_client.calls, policy_client.schemas, "
        "policy_client.ray_runner, policy_client.integrations.trl; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'service', 'fastapi', 'sqlalchemy', 'docker', 'scipy', 'uvicorn', 'pyarrow'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_field_without_bounds_is_what_the_normalizer_keeps() -> None:
    # Bounds go, types and defaults stay: a bounded and an unbounded field compare equal.
    bounded = create_model("M", n=(int, Field(3, ge=0, le=9, description="d")))
    plain = create_model("M", n=(int, 3))
    assert _model_differences(bounded, plain) == []
    assert _model_differences(create_model("M", n=(int, 4)), plain) != []
