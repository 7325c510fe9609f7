"""The Parquet export loads in every loader a trainer uses: HF ``datasets``
(``load_dataset("parquet")``, ``Dataset.from_parquet``, ``Dataset(table)``), pyarrow, pandas
and polars, with the same values as the records (schema 2: no map columns)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service import rewards
from service.rewards import RewardRecord
from tests.unit.test_rewards import _group


@pytest.fixture
def exported(tmp_path: Path) -> tuple[Path, list[RewardRecord]]:
    prompt = {
        "instruction": "Count the words.",
        "prompt_messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Count the words."},
        ],
    }
    records = [RewardRecord.model_validate({**r.model_dump(), **prompt}) for r in _group()]
    path = tmp_path / "records.parquet"
    rewards.export_parquet(records, path, normalize="grpo")
    return path, records


def _check_rows(rows: list[dict], records: list[RewardRecord]) -> None:
    assert len(rows) == len(records)
    for row, rec in zip(rows, records, strict=True):
        assert row["record_id"] == rec.record_id
        if rec.reward is None:  # pandas reads a null double as NaN
            assert row["reward"] is None or row["reward"] != row["reward"]
        else:
            assert row["reward"] == rec.reward
        assert {c["name"]: c["value"] for c in row["reward_components"]} == rec.reward_components
        assert list(row["prompt_ids"]) == rec.prompt_ids
        assert list(row["loss_mask"]) == rec.loss_mask
        assert row["instruction"] == "Count the words."
        assert [dict(m) for m in row["prompt_messages"]][1]["content"] == "Count the words."


def test_no_map_column_and_schema_2(exported: tuple[Path, list[RewardRecord]]) -> None:
    path, _ = exported
    schema = pq.read_schema(path)
    assert schema.metadata[b"crucible.schema_version"] == b"2"

    def maps(t: pa.DataType) -> bool:
        if pa.types.is_map(t):
            return True
        if pa.types.is_struct(t):
            return any(maps(f.type) for f in t)
        if pa.types.is_list(t):
            return maps(t.value_type)
        return False

    assert not [f.name for f in schema if maps(f.type)]


def test_datasets_loads_it_three_ways(exported: tuple[Path, list[RewardRecord]]) -> None:
    from datasets import Dataset, load_dataset

    path, records = exported
    by_load = load_dataset("parquet", data_files=str(path), split="train")
    _check_rows(by_load.to_list(), records)
    _check_rows(Dataset.from_parquet(str(path)).to_list(), records)
    _check_rows(Dataset(pq.read_table(path)).to_list(), records)


def test_pyarrow_pandas_polars(exported: tuple[Path, list[RewardRecord]]) -> None:
    import pandas as pd
    import polars as pl

    path, records = exported
    _check_rows(pq.read_table(path).to_pylist(), records)
    _check_rows(pd.read_parquet(path).to_dict("records"), records)
    _check_rows(pl.read_parquet(path).to_dicts(), records)


def test_a_version_1_record_reads_as_version_2() -> None:
    doc = _group()[0].model_dump(mode="json")
    doc["schema_version"] = "1"
    for key in ("instruction", "prompt_messages", "error", "missing", "missing_reason"):
        doc.pop(key)
    rec = next(rewards.read_jsonl(io.StringIO(__import__("json").dumps(doc))))
    assert rec.schema_version == "2" and rec.prompt_messages == [] and rec.missing == []
