"""jobs/batches/sharding.py against the real (moto S3) object store and the model registry:
the models a batch may use are the ones registered (here: test models of this module)."""

from __future__ import annotations

import io
import json
import random
import secrets
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import delete

from jobs.batches import service
from jobs.batches.sharding import ShardPlan, validate_and_shard
from jobs.core.context import Context
from jobs.core.schema import Batch, File, Model, Tenant, new_id
from jobs.core.status import BatchStatus
from jobs.fleet import catalog, registry
from storage import keys
from storage.parquet import read_rows

SUFFIX = secrets.token_hex(3)
MODEL = f"test-embedder-{SUFFIX}"
OTHER = f"other-embedder-{SUFFIX}"
CHAT_MODEL = f"test-chat-{SUFFIX}"
EMB = "/v1/embeddings"
FAKE_FILES = [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}]


def register(ctx: Context, name: str, kind: str = "embeddings",
             tools: bool | None = None, matryoshka: bool = False) -> None:
    """A registry row only: validation needs no files."""
    registry.register(ctx, name, "1", kind, "test", FAKE_FILES, 256, tools=tools,
                      matryoshka=matryoshka)


@pytest.fixture(scope="module", autouse=True)
def models(ctx: Context) -> Iterator[None]:
    register(ctx, MODEL, matryoshka=True)  # it serves dimensions
    register(ctx, CHAT_MODEL, "chat", tools=False)
    yield
    with ctx.db.session() as s:
        s.execute(delete(Model).where(Model.name.endswith(SUFFIX)))
    catalog.invalidate(ctx)


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
          max_requests: int = 1_000_000, endpoint: str = EMB) -> tuple[ShardPlan, str]:
    batch_id = f"batch_test_{secrets.token_hex(6)}"
    file_key = keys.file_object(f"file-test-{secrets.token_hex(6)}")
    ctx.store.put_bytes(file_key, data)
    plan = validate_and_shard(ctx.store, batch_id=batch_id, file_key=file_key,
                              file_format=fmt, endpoint=endpoint, defaults=defaults or {},
                              shard_rows=shard_rows, max_line=max_line, max_inputs=2048,
                              max_requests=max_requests, models=catalog.load(ctx))
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


def test_mismatched_model(ctx: Context) -> None:
    register(ctx, OTHER)
    rows = [line(0, "a"), line(1, "b"), line(2, "c", model=OTHER), line(3, "d")]
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
    # refused when the batch is created; a batch created before that says so once
    data = parquet_bytes({"custom_id": ["a", "b"], "input": ["x", "y"]})
    plan, _ = shard(ctx, data, fmt="parquet")
    assert codes(plan) == [("missing_model", None)]
    assert "body.model" in plan.errors[0]["message"]
    assert "--model" in plan.errors[0]["message"]


def test_a_model_registered_now_is_accepted(ctx: Context) -> None:
    name = f"new-embedder-{SUFFIX}"
    plan, _ = shard(ctx, jsonl([line(0, "hello", model=name)]))
    assert codes(plan) == [("model_not_found", 1)]
    register(ctx, name)
    plan, batch_id = shard(ctx, jsonl([line(0, "hello", model=name)]))
    assert plan.errors == [] and plan.model == name and plan.shards == [1]
    assert [r["custom_id"] for r in shard_rows_of(ctx, batch_id)[0]] == ["req-0"]


def test_unknown_model_lists_the_available_ones(ctx: Context) -> None:
    plan, _ = shard(ctx, jsonl([line(0, "hello", model="gpt-x")]))
    assert codes(plan) == [("model_not_found", 1)]
    message = plan.errors[0]["message"]
    assert message.startswith("The model 'gpt-x' does not exist")
    assert MODEL in message and CHAT_MODEL not in message  # embeddings models only
    assert plan.errors[0]["param"] == "body.model"


def test_chat_model_on_the_embeddings_endpoint(ctx: Context) -> None:
    plan, _ = shard(ctx, jsonl([line(0, "hello", model=CHAT_MODEL)]))
    assert codes(plan) == [("model_not_found", 1)]
    message = plan.errors[0]["message"]
    assert f"'{CHAT_MODEL}' is a chat model" in message and MODEL in message


@pytest.mark.parametrize(("custom_id", "shown"), [(7, "an integer 7"), (1.5, "a number 1.5"),
                                                  (True, "a boolean True"),
                                                  (["a"], "an array")])
def test_custom_id_of_another_type_is_named(ctx: Context, custom_id: Any, shown: str) -> None:
    bad = {**line(0, "x"), "custom_id": custom_id}
    plan, _ = shard(ctx, jsonl([bad, line(1, "y")]))
    assert codes(plan) == [("invalid_custom_id", 1)]
    assert f"custom_id must be a string, got {shown}" in plan.errors[0]["message"]


def test_parquet_integer_custom_id_is_named(ctx: Context) -> None:
    data = parquet_bytes({"custom_id": [1, 2], "input": ["x", "y"]})
    plan, _ = shard(ctx, data, fmt="parquet", defaults={"model": MODEL})
    assert codes(plan) == [("invalid_custom_id", 1), ("invalid_custom_id", 2)]
    assert "got an integer 1" in plan.errors[0]["message"]


@pytest.mark.parametrize("data", [
    b"custom_id,input\nreq-1,hello\nreq-2,world\n",
    b"\xef\xbb\xbfcustom_id;input\r\nreq-1;hello\r\n",
    b"\n1,2,3\n4,5,6\n",
])
def test_csv_upload_fails_once_with_a_format_hint(ctx: Context, data: bytes) -> None:
    plan, batch_id = shard(ctx, data)
    assert [e["code"] for e in plan.errors] == ["invalid_file_format"]
    assert plan.error_count == 1
    assert "JSONL" in plan.errors[0]["message"] and "Parquet" in plan.errors[0]["message"]
    assert ctx.store.list(keys.batch_prefix(batch_id)) == []


def test_jsonl_with_a_broken_first_line_reports_every_line(ctx: Context) -> None:
    rows: list[Any] = [b'{"custom_id": "req-x",', line(1, "fine"), b"oops"]
    plan, _ = shard(ctx, jsonl(rows))
    assert codes(plan) == [("invalid_json_line", 1), ("invalid_json_line", 3)]


# Client text in whole-file errors, which are stored with the batch (JSONB) ----------------

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def test_client_text_in_errors_is_escaped_and_cut_short(ctx: Context) -> None:
    huge = "m" * 100_000
    rows: list[Any] = [
        line("\x00a", "x"), line("\x00a", "dup"),          # 1, 2: duplicate, with NUL
        {**line(huge, "x"), "custom_id": huge},
        {**line(huge, "y"), "custom_id": huge},            # 4: a huge duplicate
        line(5, "x", model="bad\x00name"),                 # 5
        line(6, "x", model=huge),                          # 6
        line(7, "x", url="/v1/\x00" + huge),                # 7
    ]
    plan, _ = shard(ctx, jsonl(rows))
    assert codes(plan) == [("duplicate_custom_id", 2), ("duplicate_custom_id", 4),
                           ("model_not_found", 5), ("model_not_found", 6), ("invalid_url", 7)]
    for e in plan.errors:
        assert "\x00" not in e["message"] and len(e["message"]) < 400, e["message"][:200]
    assert "'bad\\x00name'" in plan.errors[2]["message"]
    assert plan.errors[0]["message"] == "custom_id 'req-\\x00a' appears more than once"


def batch_for(ctx: Context, data: bytes | None, endpoint: str = EMB, fmt: str = "jsonl",
              defaults: dict[str, Any] | None = None) -> str:
    """A batch in validating whose input holds ``data`` (None: its object is gone)."""
    key = keys.file_object(new_id("file-"))
    if data is not None:
        ctx.store.put_bytes(key, data)
    with ctx.db.session() as s:
        t = Tenant(id=new_id("tnt_"), name=f"sharding-{secrets.token_hex(4)}")
        s.add(t)
        s.flush()
        f = File(id=new_id("file-"), tenant_id=t.id, filename=f"in.{fmt}", purpose="batch",
                 format=fmt, bytes=len(data or b""), object_key=key)
        s.add(f)
        s.flush()
        b = Batch(id=new_id("batch_"), tenant_id=t.id, endpoint=endpoint, input_file_id=f.id,
                  completion_window="24h", status=BatchStatus.VALIDATING,
                  defaults=defaults or {})
        s.add(b)
        return b.id


def batch_state(ctx: Context, batch_id: str) -> tuple[str, list[Any] | None]:
    with ctx.db.session() as s:
        b = s.get(Batch, batch_id)
        assert b is not None
        return b.status, b.errors


def test_a_nul_in_a_model_name_fails_the_batch_with_the_name_escaped(ctx: Context) -> None:
    batch_id = batch_for(ctx, jsonl([line(0, "x", model="bad\x00name")]))
    service.validate_batch(ctx, batch_id)  # PostgreSQL stores no NUL in JSONB
    status, errors = batch_state(ctx, batch_id)
    assert status == BatchStatus.FAILED and errors is not None
    assert [(e["code"], e["line"]) for e in errors] == [("model_not_found", 1)]
    assert "'bad\\x00name'" in errors[0]["message"]


def test_a_validation_that_cannot_succeed_fails_the_batch_once(ctx: Context) -> None:
    batch_id = batch_for(ctx, None)  # the input file's object is gone
    service.validate_batch(ctx, batch_id)  # returns: nothing left to retry
    status, errors = batch_state(ctx, batch_id)
    assert status == BatchStatus.FAILED and errors is not None
    assert [e["code"] for e in errors] == ["validation_failed"]
    assert errors[0]["message"] == ("the input file could not be validated (its content is "
                                    "no longer in the object store)")  # no object key
    service.validate_batch(ctx, batch_id)  # a resent validation finds it ended
    assert batch_state(ctx, batch_id) == (status, errors)


def test_binary_parquet_columns_are_sharded_as_text(ctx: Context) -> None:
    data = parquet_bytes({"custom_id": ["a", "b"],
                          "prompt": pa.array([b"Hello", b"\xff not text"], pa.binary())})
    plan, batch_id = shard(ctx, data, fmt="parquet", endpoint=COMPLETIONS,
                           defaults={"model": CHAT_MODEL, "max_tokens": 4})
    assert plan.errors == [] and plan.total == 2 and plan.invalid == 1
    (rows,) = shard_rows_of(ctx, batch_id)
    assert [json.loads(r["body"]) for r in rows] == [
        {"model": CHAT_MODEL, "max_tokens": 4, "prompt": "Hello"}]
    (err,) = [orjson.loads(x) for x in
              ctx.store.get_bytes(keys.validation_errors(batch_id)).splitlines()]
    assert (err["custom_id"], err["response"]["status_code"]) == ("b", 400)

    messages = pa.array([[{"role": "user", "content": b"Hi"}]],
                        pa.list_(pa.struct([("role", pa.string()), ("content", pa.binary())])))
    data = parquet_bytes({"custom_id": ["c"], "messages": messages})
    plan, batch_id = shard(ctx, data, fmt="parquet", endpoint=CHAT,
                           defaults={"model": CHAT_MODEL})
    assert plan.errors == [] and plan.invalid == 0
    (rows,) = shard_rows_of(ctx, batch_id)
    assert json.loads(rows[0]["body"]) == {"model": CHAT_MODEL,
                                           "messages": [{"role": "user", "content": "Hi"}]}

    # a field no message has (here not even text) is refused by its name
    messages = pa.array([[{"role": "user", "content": "Hi", "note": b"\xff"}]],
                        pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()),
                                            ("note", pa.binary())])))
    data = parquet_bytes({"custom_id": ["d"], "messages": messages})
    plan, batch_id = shard(ctx, data, fmt="parquet", endpoint=CHAT,
                           defaults={"model": CHAT_MODEL})
    assert plan.errors == [] and plan.invalid == 1 and plan.shards == []
    (err,) = [orjson.loads(x) for x in
              ctx.store.get_bytes(keys.validation_errors(batch_id)).splitlines()]
    assert (err["response"]["body"]["error"]["param"],
            err["response"]["body"]["error"]["code"]) == ("messages.0.note", "unknown_parameter")


def test_bad_messages_cells_are_row_errors_as_text_or_structs(ctx: Context) -> None:
    good = '[{"role": "user", "content": "hi"}]'
    data = parquet_bytes({"custom_id": ["a", "b", "c"],
                          "messages": [good, "hello", '[{"role": "robot", "content": "x"}]']})
    plan, batch_id = shard(ctx, data, fmt="parquet", endpoint=CHAT,
                           defaults={"model": CHAT_MODEL})
    assert plan.errors == [] and plan.total == 3 and plan.invalid == 2
    assert [r["custom_id"] for r in shard_rows_of(ctx, batch_id)[0]] == ["a"]
    errs = {e["custom_id"]: e["response"] for e in
            map(orjson.loads, ctx.store.get_bytes(keys.validation_errors(batch_id)).splitlines())}
    assert sorted(errs) == ["b", "c"] and {r["status_code"] for r in errs.values()} == {400}
    assert "JSON array" in errs["b"]["body"]["error"]["message"]
    assert errs["b"]["body"]["error"]["param"] == "messages"


def test_a_dataset_for_another_endpoint_names_each_endpoints_column(ctx: Context) -> None:
    data = parquet_bytes({"custom_id": ["a"], "messages": ['[{"role": "user"}]']})
    plan, _ = shard(ctx, data, fmt="parquet", defaults={"model": MODEL})
    assert codes(plan) == [("invalid_dataset", None)]
    message = plan.errors[0]["message"]
    assert "needs a custom_id column and an input column" in message
    assert "messages for /v1/chat/completions" in message
    assert "input for /v1/embeddings" in message


def test_a_line_whose_values_have_the_wrong_json_type_gets_an_error_line(ctx: Context) -> None:
    """As a direct call: no string is a number or a boolean, no boolean a number."""
    chat = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]

    def gen(i: str, **params: Any) -> dict[str, Any]:
        return {"custom_id": i, "method": "POST", "url": chat,
                "body": {"model": CHAT_MODEL, "messages": msgs, **params}}

    rows = [gen("bool-int", max_tokens=True), gen("str-float", temperature="0.5"),
            gen("str-bool", stream="yes"), gen("float-int", max_tokens=4.0),
            gen("ok", max_tokens=4, temperature=1, top_p=0.5, seed=3)]
    plan, batch_id = shard(ctx, jsonl(rows), endpoint=chat)
    assert plan.errors == [] and plan.total == 5 and plan.invalid == 4
    errs = {e["custom_id"]: e["response"] for e in
            map(orjson.loads, ctx.store.get_bytes(keys.validation_errors(batch_id)).splitlines())}
    assert {k: (r["status_code"], r["body"]["error"]["param"]) for k, r in errs.items()} == {
        "bool-int": (400, "max_tokens"), "str-float": (400, "temperature"),
        "str-bool": (400, "stream"), "float-int": (400, "max_tokens")}
    assert "expected an integer, got a boolean (true)" in \
        errs["bool-int"]["body"]["error"]["message"]
    (shard_rows,) = shard_rows_of(ctx, batch_id)
    assert [r["custom_id"] for r in shard_rows] == ["ok"]
    assert json.loads(shard_rows[0]["body"])["temperature"] == 1.0

    rows = [line("ids", [[True, False]]), line("dims", "x"), line("ok", [[1, 2]])]
    rows[1]["body"]["dimensions"] = "8"
    plan, batch_id = shard(ctx, jsonl(rows))
    assert plan.errors == [] and plan.total == 3 and plan.invalid == 2
    errs = {e["custom_id"]: e["response"]["body"]["error"] for e in
            map(orjson.loads, ctx.store.get_bytes(keys.validation_errors(batch_id)).splitlines())}
    assert (errs["req-ids"]["param"], errs["req-dims"]["param"]) == ("input.0.0", "dimensions")


def errors_by_id(ctx: Context, batch_id: str) -> dict[str, dict[str, Any]]:
    return {e["custom_id"]: e["response"] for e in
            map(orjson.loads, ctx.store.get_bytes(keys.validation_errors(batch_id)).splitlines())}


def test_a_line_with_a_parameter_inferq_does_not_support_gets_an_error_line(
        ctx: Context) -> None:
    """Never ignored: each such line is its error line, naming the parameter; the
    others are sharded, less the parameters taken at the value that does nothing."""
    chat = "/v1/chat/completions"

    def gen(i: str, **params: Any) -> dict[str, Any]:
        return {"custom_id": i, "method": "POST", "url": chat,
                "body": {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}],
                         **params}}

    rows = [gen("json", response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"$ref": "#/nowhere"}}}), gen("store", store=True),
            gen("tools", tools=[{"type": "function", "function": {"name": "f"}}]),
            gen("typo", temprature=0.5), gen("tier", service_tier="flex"),
            gen("ok", max_tokens=4, presence_penalty=0, logprobs=False, store=False, n=1)]
    rows.append(gen("tool-msg"))
    rows[-1]["body"]["messages"].append({"role": "tool", "content": "4", "tool_call_id": "c"})
    plan, batch_id = shard(ctx, jsonl(rows), endpoint=chat)
    assert plan.errors == [] and plan.total == 7 and plan.invalid == 6
    errs = errors_by_id(ctx, batch_id)
    assert {k: (r["status_code"], r["body"]["error"]["param"], r["body"]["error"]["code"])
            for k, r in errs.items()} == {
        "json": (400, "response_format", "invalid_request"),  # a schema it cannot enforce
        "store": (400, "store", "unsupported_parameter"),
        "tools": (400, "tools", "unsupported_parameter"),
        "typo": (400, "temprature", "unknown_parameter"),
        "tier": (400, "service_tier", "unsupported_parameter"),
        "tool-msg": (400, "tools", "unsupported_parameter")}  # its template has no tools
    assert errs["store"]["body"]["error"]["message"].startswith("store: unsupported")
    (rows_,) = shard_rows_of(ctx, batch_id)
    assert [r["custom_id"] for r in rows_] == ["ok"]
    assert json.loads(rows_[0]["body"]) == {"model": CHAT_MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"}], "presence_penalty": 0, "logprobs": False, "n": 1}

    emb = [line("dims", "x"), line("extra", "x"), line("ok", "x")]
    emb[0]["body"]["dimensions"] = 8
    emb[1]["body"]["temperature"] = 0
    plan, batch_id = shard(ctx, jsonl(emb))
    assert plan.invalid == 1
    assert errors_by_id(ctx, batch_id)["req-extra"]["body"]["error"]["param"] == "temperature"


def test_dimensions_only_for_a_model_trained_for_shortened_vectors(ctx: Context) -> None:
    full = f"full-embedder-{SUFFIX}"
    register(ctx, full)  # not matryoshka
    emb = [line("dims", "x", model=full), line("ok", "x", model=full)]
    emb[0]["body"]["dimensions"] = 8
    plan, batch_id = shard(ctx, jsonl(emb))
    assert plan.invalid == 1 and plan.total == 2
    err = errors_by_id(ctx, batch_id)["req-dims"]["body"]["error"]
    assert (err["param"], err["code"]) == ("dimensions", "unsupported_parameter")
    assert "not trained for shortened vectors" in err["message"]
    (rows_,) = shard_rows_of(ctx, batch_id)
    assert [r["custom_id"] for r in rows_] == ["req-ok"]


def test_jsonl_lines_take_the_batch_body_defaults_their_own_fields_win(ctx: Context) -> None:
    """As for a Parquet row: the batch's ``body`` under every line."""
    rows = [{"custom_id": "no-model", "method": "POST", "url": EMB, "body": {"input": "a b"}},
            line("own-model", "c"), {"custom_id": "own-dims", "method": "POST", "url": EMB,
                                      "body": {"input": "d", "dimensions": 16}}]
    plan, batch_id = shard(ctx, jsonl(rows), defaults={"model": MODEL, "dimensions": 8})
    assert plan.errors == [] and plan.invalid == 0 and plan.model == MODEL
    bodies = {r["custom_id"]: json.loads(r["body"]) for s in shard_rows_of(ctx, batch_id)
              for r in s}
    assert bodies == {"no-model": {"model": MODEL, "input": "a b", "dimensions": 8},
                      "req-own-model": {"model": MODEL, "input": "c", "dimensions": 8},
                      "own-dims": {"model": MODEL, "input": "d", "dimensions": 16}}
    # a default a line could not take makes each line's error line, as in a Parquet row
    # (POST /v1/batches refuses such defaults: this is a batch stored before that)
    plan, batch_id = shard(ctx, jsonl([line(0, "x")]), defaults={"echo": True})
    assert plan.invalid == 1
    assert errors_by_id(ctx, batch_id)["req-0"]["body"]["error"]["param"] == "echo"
    # without defaults a line still needs its model
    plan, _ = shard(ctx, jsonl(rows[:1]))
    assert codes(plan) == [("missing_model", 1)]


def test_responses_lines_and_rows_are_sharded_as_their_bodies(ctx: Context) -> None:
    """/v1/responses: a chat model's; a line's body as its schema reads it, its length
    and upper-bound tokens those of the chat request it runs as; a Parquet ``input``
    column of text under the batch's defaults; a refused parameter is its error line."""
    from jobs.protocol.endpoints import CHAT, RESPONSES
    from jobs.protocol.parsing import parse_responses
    from jobs.protocol.responses_request import chat_body
    from jobs.tenants.token_counts import prompt_tokens

    def rline(i: str, **body: Any) -> dict[str, Any]:
        return {"custom_id": i, "method": "POST", "url": RESPONSES, "body": body}

    turns = [{"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
             {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
             {"role": "user", "content": "Another?"}]
    rows = [rline("text", input="Say hi."), rline("turns", input=turns, store=False),
            rline("stored", input="hi", store=True)]
    plan, batch_id = shard(ctx, jsonl(rows), endpoint=RESPONSES,
                           defaults={"model": CHAT_MODEL, "instructions": "Be brief."})
    assert plan.errors == [] and plan.total == 3 and plan.invalid == 1
    assert errors_by_id(ctx, batch_id)["stored"]["body"]["error"]["param"] == "store"
    (shard_rows,) = shard_rows_of(ctx, batch_id)
    bodies = {r["custom_id"]: json.loads(r["body"]) for r in shard_rows}
    assert bodies["text"] == {"model": CHAT_MODEL, "instructions": "Be brief.",
                              "input": "Say hi."}
    assert bodies["turns"]["input"][1]["content"] == [{"type": "output_text",
                                                       "text": "Blue."}]
    chats = {k: chat_body(parse_responses(b)) for k, b in bodies.items()}
    assert {r["custom_id"]: r["length"] for r in shard_rows} == {
        k: sum(len(m["content"]) for m in c["messages"]) for k, c in chats.items()}
    assert plan.input_tokens == sum(prompt_tokens(CHAT, c) for c in chats.values())

    data = parquet_bytes({"custom_id": ["a", "b"], "input": ["Say hi.", ""]})
    plan, batch_id = shard(ctx, data, fmt="parquet", endpoint=RESPONSES,
                           defaults={"model": CHAT_MODEL, "max_output_tokens": 4})
    assert plan.errors == [] and plan.total == 2 and plan.invalid == 1
    assert errors_by_id(ctx, batch_id)["b"]["body"]["error"]["param"] == "input"
    (shard_rows,) = shard_rows_of(ctx, batch_id)
    assert [json.loads(r["body"]) for r in shard_rows] == [
        {"model": CHAT_MODEL, "max_output_tokens": 4, "input": "Say hi."}]
    # an embeddings model does not serve it
    plan, _ = shard(ctx, jsonl([rline("e", model=MODEL, input="hi")]), endpoint=RESPONSES)
    assert codes(plan) == [("model_not_found", 1)]
