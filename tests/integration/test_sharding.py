"""jobs/sharding.py against the real (moto S3) object store."""

from __future__ import annotations

import io
import json
import random
import secrets
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import requests as jobs_requests
from jobs.context import Context
from jobs.sharding import ShardPlan, validate_and_shard
from storage import keys
from storage.parquet import read_rows

MODEL = "all-MiniLM-L6-v2"
EMB = "/v1/embeddings"


def line(i: int | str, text: Any, model: str = MODEL, url: str = EMB,
         **extra: Any) -> dict[str, Any]:
    return {"custom_id": f"req-{i}", "method": "POST", "url": url,
            "body": {"model": model, "input": text}, **extra}


def jsonl(rows: list[Any]) -> bytes:
    out = b""
    for r in rows:
        out += (r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n"
    return out


def parquet_bytes(columns: dict[str, list[Any]], row_group_size: int | None = None) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(columns), buf, row_group_size=row_group_size)
    return buf.getvalue()


def shard(ctx: Context, data: bytes, *, fmt: str = "jsonl", shard_rows: int = 400,
          max_line: int = 1024 * 1024, defaults: dict[str, Any] | None = None,
          max_requests: int = 1_000_000) -> tuple[ShardPlan, str]:
    batch_id = f"batch_test_{secrets.token_hex(6)}"
    file_key = keys.file_object(f"file-test-{secrets.token_hex(6)}")
    ctx.store.put_bytes(file_key, data)
    plan = validate_and_shard(ctx.store, batch_id=batch_id, file_key=file_key,
                              file_format=fmt, endpoint=EMB, defaults=defaults or {},
                              shard_rows=shard_rows, max_line=max_line, max_inputs=2048,
                              max_requests=max_requests)
    return plan, batch_id


def shard_rows_of(ctx: Context, batch_id: str) -> list[list[dict[str, Any]]]:
    found = ctx.store.list(keys.batch_prefix(batch_id) + "shards/")
    expected = [keys.shard_input(batch_id, i) for i in range(len(found))]
    assert found == expected
    return [read_rows(io.BytesIO(ctx.store.get_bytes(k))) for k in found]


def codes(plan: ShardPlan) -> list[tuple[str, int | None]]:
    return [(e["code"], e["line"]) for e in plan.errors]


def test_valid_jsonl_is_sharded_and_sorted_by_length(ctx: Context) -> None:
    rng = random.Random(7)
    texts = [" ".join(["word"] * rng.randint(1, 60)) for _ in range(25)]
    rows: list[Any] = [line(i, t) for i, t in enumerate(texts)]
    rows.insert(10, b"   ")  # blank lines are skipped but still counted
    plan, batch_id = shard(ctx, jsonl(rows), shard_rows=10)
    assert plan.errors == [] and plan.error_count == 0
    assert plan.total == 25 and plan.invalid == 0
    assert plan.model == MODEL
    assert plan.shards == [10, 10, 5]
    shards = shard_rows_of(ctx, batch_id)
    assert [len(s) for s in shards] == [10, 10, 5]
    seen = []
    for s in shards:
        lengths = [r["length"] for r in s]
        assert lengths == sorted(lengths)
        assert len(set(lengths)) > 1  # the sort is not vacuous
        for r in s:
            i = int(r["custom_id"].removeprefix("req-"))
            assert r["line"] == (i + 1 if i < 10 else i + 2)
            body = json.loads(r["body"])
            assert body == {"model": MODEL, "input": texts[i]}
            assert r["length"] == len(texts[i])
            seen.append(i)
    assert sorted(seen) == list(range(25))
    # shards are cut in file order: the first shard holds the first ten requests
    assert sorted(int(r["custom_id"][4:]) for r in shards[0]) == list(range(10))
    assert not ctx.store.exists(keys.validation_errors(batch_id))


def test_shard_rows_exact_multiple_has_no_empty_shard(ctx: Context) -> None:
    plan, batch_id = shard(ctx, jsonl([line(i, "x" * (i + 1)) for i in range(8)]), shard_rows=4)
    assert plan.shards == [4, 4]
    assert [len(s) for s in shard_rows_of(ctx, batch_id)] == [4, 4]


def test_token_array_inputs_are_accepted(ctx: Context) -> None:
    plan, batch_id = shard(ctx, jsonl([line(0, [1, 2, 3]), line(1, [[1], [2, 3]]),
                                       line(2, ["a", "bc"])]))
    assert plan.errors == [] and plan.shards == [3] and plan.invalid == 0
    (rows,) = shard_rows_of(ctx, batch_id)
    assert {r["custom_id"]: r["length"] for r in rows} == {"req-0": 3, "req-1": 3, "req-2": 3}


BAD_LINES: dict[str, Any] = {
    "invalid_json_line": b'{"custom_id": "req-x", "method": "POST",',
    "duplicate_custom_id": line(0, "again"),
    "invalid_url": line("u", "hello", url="/v1/chat/completions"),
    "invalid_method": line("m", "hello", method="GET"),
    "model_not_found": line("n", "hello", model="no-such-model"),
    "invalid_encoding": b'{"custom_id": "req-e", "body": "\xff\xfe"}',
    "missing_custom_id": {"method": "POST", "url": EMB, "body": {"model": MODEL, "input": "x"}},
    "missing_model": {"custom_id": "req-mm", "url": EMB, "body": {"input": "x"}},
    "invalid_body": {"custom_id": "req-b", "url": EMB, "body": "not an object"},
}


@pytest.mark.parametrize("code", sorted(BAD_LINES))
def test_whole_file_error_fails_with_line_and_leaves_no_shards(ctx: Context, code: str) -> None:
    rows: list[Any] = [line(i, f"text number {i}") for i in range(6)]
    rows.insert(4, BAD_LINES[code])  # line 5, after a first shard was already written
    plan, batch_id = shard(ctx, jsonl(rows), shard_rows=2)
    assert codes(plan) == [(code, 5)]
    assert plan.error_count == 1
    assert plan.shards == []
    assert plan.errors[0]["message"]
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_mismatched_model(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(jobs_requests.MODELS, "other-embedder", "embeddings")
    rows = [line(0, "a"), line(1, "b"), line(2, "c", model="other-embedder"), line(3, "d")]
    plan, batch_id = shard(ctx, jsonl(rows), shard_rows=1)
    assert codes(plan) == [("mismatched_model", 3)]
    assert plan.errors[0]["param"] == "body.model"
    assert plan.model == MODEL
    assert plan.shards == []
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_all_errors_are_collected_with_line_numbers(ctx: Context) -> None:
    rows: list[Any] = [
        line(0, "ok"),                       # 1
        b"not json",                         # 2
        line(0, "dup"),                      # 3
        b"[1, 2]",                           # 4  valid JSON but not an object
        line(4, "ok", url="/v1/completions"),  # 5
        line(5, "ok"),                       # 6
        line(6, "ok", model="gpt-x"),        # 7
    ]
    plan, batch_id = shard(ctx, jsonl(rows))
    assert codes(plan) == [("invalid_json_line", 2), ("duplicate_custom_id", 3),
                           ("invalid_json_line", 4), ("invalid_url", 5),
                           ("model_not_found", 7)]
    assert plan.error_count == 5
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_line_too_long_and_following_lines_still_read(ctx: Context) -> None:
    max_line = 200
    rows: list[Any] = [line(0, "short"), line(1, "y" * 1000), line(2, "fine"),
                       b"{broken", line(0, "dup of line 1")]
    plan, batch_id = shard(ctx, jsonl(rows), max_line=max_line)
    assert codes(plan) == [("line_too_long", 2), ("invalid_json_line", 4),
                           ("duplicate_custom_id", 5)]
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_line_too_long_longer_than_read_buffer(ctx: Context) -> None:
    # a line spanning several reader buffers (1 MiB) is skipped as a whole
    huge = line(1, "z" * (3 * 1024 * 1024))
    plan, _ = shard(ctx, jsonl([line(0, "a"), huge, b"{bad"]), max_line=1024)
    assert codes(plan) == [("line_too_long", 2), ("invalid_json_line", 3)]


def test_max_line_boundary(ctx: Context) -> None:
    ok = json.dumps(line(0, "q" * 50)).encode()
    max_line = len(ok)
    over = json.dumps(line(1, "q" * 51)).encode()
    assert len(over) == max_line + 1
    plan, _ = shard(ctx, ok + b"\n" + over + b"\n", max_line=max_line)
    assert codes(plan) == [("line_too_long", 2)]
    # the same holds for a last line without a trailing newline
    plan, _ = shard(ctx, ok + b"\n" + over, max_line=max_line)
    assert codes(plan) == [("line_too_long", 2)]
    plan, batch_id = shard(ctx, ok, max_line=max_line)
    assert plan.errors == [] and plan.shards == [1]


@pytest.mark.parametrize("data", [b"", b"\n", b"\n  \n\r\n"])
def test_empty_file(ctx: Context, data: bytes) -> None:
    plan, batch_id = shard(ctx, data)
    assert codes(plan) == [("empty_file", None)]
    assert plan.shards == [] and plan.total == 0
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_too_many_requests(ctx: Context) -> None:
    plan, batch_id = shard(ctx, jsonl([line(i, "t") for i in range(5)]), max_requests=3,
                           shard_rows=2)
    assert codes(plan) == [("too_many_requests", 4)]
    assert plan.error_count == 1
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_per_request_errors_go_to_the_validation_error_object(ctx: Context) -> None:
    rows = [line(0, "good one"), line(1, 5), line(2, "good two"), line(3, ""),
            line(4, []), line(5, "good three")]
    plan, batch_id = shard(ctx, jsonl(rows), shard_rows=2)
    assert plan.errors == [] and plan.error_count == 0
    assert plan.total == 6
    assert plan.invalid == 3
    assert plan.shards == [2, 1]
    sharded = {r["custom_id"] for s in shard_rows_of(ctx, batch_id) for r in s}
    assert sharded == {"req-0", "req-2", "req-5"}
    raw = ctx.store.get_bytes(keys.validation_errors(batch_id))
    errs = [orjson.loads(x) for x in raw.splitlines()]
    assert [e["custom_id"] for e in errs] == ["req-1", "req-3", "req-4"]
    for e in errs:
        assert e["id"].startswith("batch_req_")
        assert e["error"] is None
        resp = e["response"]
        assert resp["status_code"] == 400
        err = resp["body"]["error"]
        assert err["type"] == "invalid_request_error"
        assert err["code"]
        assert err["message"]
        assert err["param"].startswith("input")


def test_all_requests_invalid_is_not_an_empty_file(ctx: Context) -> None:
    plan, batch_id = shard(ctx, jsonl([line(0, ""), line(1, 7)]))
    assert plan.errors == []
    assert plan.total == 2 and plan.invalid == 2 and plan.shards == []
    assert len(ctx.store.get_bytes(keys.validation_errors(batch_id)).splitlines()) == 2


def test_parquet_dataset_with_defaults(ctx: Context) -> None:
    n = 11
    texts = [("w " * ((i * 7) % 13 + 1)).strip() for i in range(n)]
    data = parquet_bytes({"custom_id": [f"p-{i}" for i in range(n)], "input": texts},
                         row_group_size=3)
    plan, batch_id = shard(ctx, data, fmt="parquet", shard_rows=4, defaults={"model": MODEL})
    assert plan.errors == []
    assert plan.total == n and plan.invalid == 0 and plan.model == MODEL
    assert plan.shards == [4, 4, 3]
    shards = shard_rows_of(ctx, batch_id)
    got = {}
    for s in shards:
        assert [r["length"] for r in s] == sorted(r["length"] for r in s)
        for r in s:
            got[r["custom_id"]] = r
    assert sorted(got) == sorted(f"p-{i}" for i in range(n))
    for i in range(n):
        r = got[f"p-{i}"]
        assert r["line"] == i + 1
        assert json.loads(r["body"]) == {"model": MODEL, "input": texts[i]}


def test_parquet_per_row_problems(ctx: Context) -> None:
    data = parquet_bytes({"custom_id": ["a", "b", "a", "c"], "input": ["x", "", "y", None]})
    plan, batch_id = shard(ctx, data, fmt="parquet", defaults={"model": MODEL})
    assert codes(plan) == [("duplicate_custom_id", 3)]
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_parquet_without_input_column(ctx: Context) -> None:
    data = parquet_bytes({"custom_id": ["a", "b"], "text": ["x", "y"]})
    plan, batch_id = shard(ctx, data, fmt="parquet", defaults={"model": MODEL})
    assert [e["code"] for e in plan.errors] == ["invalid_dataset"]
    assert "text" in plan.errors[0]["message"]
    assert plan.shards == []
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_parquet_without_custom_id_column(ctx: Context) -> None:
    data = parquet_bytes({"input": ["x", "y"]})
    plan, _ = shard(ctx, data, fmt="parquet", defaults={"model": MODEL})
    assert [e["code"] for e in plan.errors] == ["invalid_dataset"]


def test_unreadable_parquet(ctx: Context) -> None:
    plan, batch_id = shard(ctx, b"PAR1 this is not really parquet", fmt="parquet",
                           defaults={"model": MODEL})
    assert [e["code"] for e in plan.errors] == ["invalid_dataset"]
    assert plan.shards == []
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_parquet_without_model_default(ctx: Context) -> None:
    data = parquet_bytes({"custom_id": ["a", "b"], "input": ["x", "y"]})
    plan, _ = shard(ctx, data, fmt="parquet")
    assert codes(plan) == [("missing_model", 1), ("missing_model", 2)]
