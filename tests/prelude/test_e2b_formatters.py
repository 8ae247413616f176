"""The E2B sandbox's display formatters as plain functions (sunroom.prelude.e2b), in-process."""

from __future__ import annotations

import datetime
import json
import uuid

import numpy as np
import pandas as pd  # type: ignore[import-untyped, unused-ignore]
import pytest

from sunroom.prelude.e2b import MAX_JSON_VALUES, dataframe_data, json_value


def test_json_value_converts_as_orjson_does_and_refuses_what_is_not_json() -> None:
    value = {
        "ints": np.arange(2),
        "f32": np.float32(0.5),
        "nan": float("nan"),
        "flag": np.bool_(True),
        "when": datetime.datetime(2024, 1, 2, 3, 4),
        "tuple": (1, None),
        None: "null key",
        2.5: "float key",
    }
    assert json_value(value) == {
        "ints": [0, 1],
        "f32": 0.5,
        "nan": None,
        "flag": True,
        "when": "2024-01-02T03:04:00",
        "tuple": [1, None],
        "null": "null key",
        "2.5": "float key",
    }
    deep: list[object] = []
    for _ in range(40):
        deep = [deep]
    for not_json in ([object()], {(1, 2): 1}, [1 << 70], [uuid.uuid4()], deep, (1, 2), "s"):
        assert json_value(not_json) is None, not_json


def test_json_value_refuses_what_is_too_large_before_copying_it() -> None:
    with pytest.raises(ValueError, match="more than 10,000 values"):
        json_value({"a": np.zeros(50_000_000)})  # 400 MB as a list: never made
    with pytest.raises(ValueError, match="more than 10,000 values"):
        json_value(list(range(MAX_JSON_VALUES)))
    with pytest.raises(ValueError, match="bytes of JSON"):
        json_value(["x" * 1_100_000])
    assert json_value(list(range(MAX_JSON_VALUES - 1))) == list(range(MAX_JSON_VALUES - 1))


def test_dataframe_data_is_json_text_of_its_columns() -> None:
    df = pd.DataFrame(
        {
            "t": pd.to_datetime(["2024-01-02", None]),
            "n": pd.array([1, None], dtype="Int64"),
            "o": [{1, 2}, pd.Timedelta("1h")],
        }
    )
    assert json.loads(str(dataframe_data(df))) == {
        "t": ["2024-01-02T00:00:00", None],
        "n": [1, None],
        "o": ["{1, 2}", "0 days 01:00:00"],  # not JSON: its str
    }
    assert dataframe_data({"a": [1]}) is None and dataframe_data(df["t"]) is None
    with pytest.raises(ValueError, match="300,000 cells"):
        dataframe_data(pd.DataFrame({"a": range(300_000)}))
