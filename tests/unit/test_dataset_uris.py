"""Dataset URIs (storage.datasets) on the local filesystem, and how a row becomes a
request (jobs.batches.datasets.RowForm): no server involved."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from jobs.batches.dataset_columns import text_hashes
from jobs.batches.datasets import Manifest, RowForm, template_fields
from jobs.core.errors import InvalidRequest
from jobs.protocol.batch import DatasetInput
from jobs.protocol.endpoints import CHAT, EMBEDDINGS, RESPONSES
from storage import datasets as ds


def test_uris_parse_and_nest() -> None:
    loc = ds.parse("s3://lake/team-a/reviews/*.parquet")
    assert (loc.scheme, loc.bucket, loc.key, loc.is_glob) == (
        "s3", "lake", "team-a/reviews/*.parquet", True)
    assert loc.within(ds.parse("s3://lake/team-a/"))
    assert loc.within(ds.parse("s3://lake/team-a"))  # a path boundary, slash or not
    assert not ds.parse("s3://lake/team-ab/x").within(ds.parse("s3://lake/team-a"))
    assert not loc.within(ds.parse("s3://other/team-a/"))
    assert not ds.parse("file:///data/a").within(ds.parse("s3://data/"))
    assert ds.parse("s3://lake/x").within(ds.parse("s3://lake/"))
    for bad, why in (("http://x/y", "s3:// or file://"), ("s3:///key", "names its bucket"),
                     ("s3://lake/a/../b", ". or .."), ("file://host/x", "local path"),
                     ("s3://lake/a?b=1", "no query")):
        with pytest.raises(ds.BadLocation, match=why):
            ds.parse(bad)


def test_listing_a_prefix_a_glob_and_one_file(tmp_path: Path) -> None:
    for name in ("a/1.parquet", "a/2.parquet", "a/sub/3.parquet", "a/_SUCCESS",
                 "a/.1.parquet.crc", "a/notes.txt", "ab/4.parquet"):
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * 3)
    base = f"file://{tmp_path}"

    def names(uri: str) -> list[str]:
        return [o.uri.removeprefix(base + "/") for o in ds.list_objects(ds.parse(uri), 100)]

    assert names(f"{base}/a/") == ["a/1.parquet", "a/2.parquet", "a/notes.txt",
                                   "a/sub/3.parquet"]
    assert names(f"{base}/a/*.parquet") == ["a/1.parquet", "a/2.parquet"]
    assert names(f"{base}/a/**.parquet") == ["a/1.parquet", "a/2.parquet", "a/sub/3.parquet"]
    assert names(f"{base}/a/1.parquet") == ["a/1.parquet"]
    assert names(f"{base}/a/1.parq") == []  # a prefix of a name is not the object
    with pytest.raises(ds.BadLocation, match="more than 2 objects"):
        ds.list_objects(ds.parse(f"{base}/a/"), 2)


def test_a_local_object_rewritten_after_listing_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_bytes(b"one\n")
    [obj] = ds.list_objects(ds.parse(f"file://{p}"), 10)
    with ds.open_pinned(obj) as f:
        assert f.read() == b"one\n"
    p.write_bytes(b"two, longer\n")
    os.utime(p, ns=(1, 1))
    with pytest.raises(ds.SourceChanged, match="changed after it was listed"):
        ds.open_pinned(obj)


def manifest(endpoint: str, **spec: object) -> Manifest:
    s = DatasetInput.model_validate({"uri": "s3://b/k", **spec})
    return Manifest(uri=s.uri, format="parquet", id_column=s.id_column,
                    input_column=s.input_column, template=s.template, system=s.system,
                    files=[], endpoint=endpoint)


def test_a_rows_body_is_the_schemas_reading_of_its_request() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "label", "schema": {
        "type": "object", "properties": {"label": {"type": "string"}},
        "required": ["label"]}}}
    m = manifest(CHAT, template="Review: {title}", system="Be brief.")
    form = RowForm.build(CHAT, {"model": "m", "response_format": fmt, "max_tokens": 4}, m,
                         None)
    assert form.fast
    body = orjson.loads(form.body('a "quoted"\nline'))
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": 'a "quoted"\nline'}]
    assert body["response_format"] == fmt and body["max_tokens"] == 4
    assert form.extra_len == len("Be brief.")
    emb = RowForm.build(EMBEDDINGS, {"model": "e"}, manifest(EMBEDDINGS), None)
    assert orjson.loads(emb.body("t")) == {"model": "e", "input": "t"}
    resp = RowForm.build(RESPONSES, {"model": "m"}, manifest(RESPONSES, system="S"), None)
    assert orjson.loads(resp.body("q")) == {"model": "m", "input": "q", "instructions": "S"}
    with pytest.raises(InvalidRequest, match="body"):  # bad defaults fail once, up front
        RowForm.build(CHAT, {"model": "m", "temperature": "hot"}, m, None)


def test_templates_name_columns_only() -> None:
    assert template_fields("{title}: {body} ({title}) {{literal}}") == ["title", "body"]
    for bad in ("{a.b}", "{a[0]}", "{a!r}", "{a:>10}", "{}", "no fields", "{unclosed"):
        with pytest.raises(InvalidRequest):
            template_fields(bad)


def test_equal_ids_hash_alike_across_array_layouts() -> None:
    import pyarrow as pa

    a = pa.array(["x", "", None, "xy", "yx", "x"])
    h = text_hashes(a).tolist()
    assert h[0] == h[5] and h[1] == h[2] and len({h[0], h[1], h[3], h[4]}) == 4
    sliced = pa.array(["pad", "x", "xy"]).slice(1)
    assert text_hashes(sliced).tolist() == [h[0], h[3]]
    assert text_hashes(pa.array(["x", "xy"], pa.large_string())).tolist() == [h[0], h[3]]
