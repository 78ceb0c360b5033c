"""inferq.client against the session's stack (API, control worker, a model worker with
the packaged models): a pandas frame embedded, a polars frame answered through a
template, a pyarrow Table keyed by its own id column; the results joined to the rows in
their order (a row that failed says why); the same cell run again (as after a restarted
kernel) waits for the same batch instead of submitting another."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from openai import OpenAI

from inferq import client as iq

EMBEDDER = "all-MiniLM-L6-v2"
CHAT = "SmolLM2-135M-Instruct"


@pytest.fixture
def api(stack, tenant_key) -> OpenAI:  # type: ignore[no-untyped-def]
    return iq.connect(stack.base_url + "/v1", tenant_key)


def test_a_pandas_frame_gets_its_embeddings_in_row_order(api: OpenAI, sdk: Any) -> None:
    texts = [f"row {i}: " + "word " * (i % 9) for i in range(120)]
    texts[5] = "word " * 5000  # over the model's context: it fails alone
    df = pd.DataFrame({"text": texts, "n": range(120)}, index=range(1000, 1120))
    out = iq.embed(df, column="text", model=EMBEDDER, client=api, progress=False,
                   poll_s=0.2)
    assert isinstance(out, pd.DataFrame) and list(out.index) == list(df.index)
    assert list(out["n"]) == list(range(120))
    assert out["error"].isna().tolist() == [i != 5 for i in range(120)]
    assert out["error"].iloc[5] == "context_length_exceeded"
    assert out["embedding"].isna().tolist() == [i == 5 for i in range(120)]
    assert {len(v) for i, v in enumerate(out["embedding"]) if i != 5} == {384}
    # Row 7's vector is row 7's text's: the realtime answer for that text.
    one = sdk.embeddings.create(model=EMBEDDER, input=df["text"].iloc[7],
                                encoding_format="float").data[0].embedding
    assert np.allclose(out["embedding"].iloc[7], one, atol=1e-4)
    # Its output through the client again: the result columns are replaced, not doubled.
    twice = iq.embed(out, column="text", model=EMBEDDER, client=api, progress=False,
                     poll_s=0.2)
    assert list(twice.columns) == ["text", "n", "embedding", "error"]
    # Run again, as after a restarted kernel: the same batch answers, nothing new runs.
    before = sdk.batches.list(limit=100).data
    again = iq.submit(df, iq.EMBEDDINGS, {"input": pa.array(df["text"])},
                      {"model": EMBEDDER}, client=api)
    assert again.batch_id in {b.id for b in before}
    assert len(sdk.batches.list(limit=100).data) == len(before)


def test_a_polars_frame_answered_through_a_template(api: OpenAI) -> None:
    df = pl.DataFrame({"title": ["Great", "Awful", "Fine"],
                       "body": ["I loved it.", "It broke at once.", "It works."]})
    out = iq.chat(df, model=CHAT, template="Review: {title}. {body} Is it positive?",
                  system="Answer yes or no.", max_tokens=4, temperature=0.0, client=api,
                  progress=False, poll_s=0.2)
    assert isinstance(out, pl.DataFrame)
    assert out.columns == ["title", "body", "content", "finish_reason", "error"]
    assert out["title"].to_list() == ["Great", "Awful", "Fine"]
    assert out["error"].null_count() == 3 and all(out["content"].to_list())
    assert set(out["finish_reason"].to_list()) <= {"stop", "length"}


def test_a_table_keyed_by_its_id_column_and_attached_by_batch_id(api: OpenAI) -> None:
    t = pa.table({"doc": ["d-3", "d-1", "d-2"], "text": ["three", "one", "two"]})
    run = iq.submit(t, iq.EMBEDDINGS, {"input": t.column("text")}, {"model": EMBEDDER},
                    id_column="doc", client=api)
    again = iq.attach(run.batch_id, id_column="doc", client=api)  # a new kernel
    out = again.result(t, progress=False, poll_s=0.2)
    assert isinstance(out, pa.Table) and out.column("doc").to_pylist() == ["d-3", "d-1", "d-2"]
    assert out.column("error").null_count == 3
    with pytest.raises(ValueError, match="must be distinct"):
        iq.submit(pa.table({"doc": ["a", "a"], "text": ["x", "y"]}), iq.EMBEDDINGS,
                  {"input": pa.array(["x", "y"])}, {"model": EMBEDDER}, id_column="doc",
                  client=api)
