"""Shared helpers for end-to-end tests."""

from __future__ import annotations

import io
import json
import time
from typing import Any


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def emb_line(i: int | str, text: str, model: str = "all-MiniLM-L6-v2",
             url: str = "/v1/embeddings") -> dict[str, Any]:
    return {"custom_id": f"req-{i}", "method": "POST", "url": url,
            "body": {"model": model, "input": text}}


def upload(sdk: Any, data: bytes, name: str = "input.jsonl") -> Any:
    return sdk.files.create(file=(name, io.BytesIO(data)), purpose="batch")


def wait(sdk: Any, batch_id: str, timeout: float = 300,
         until: tuple[str, ...] = ("completed", "failed", "cancelled", "expired")) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = sdk.batches.retrieve(batch_id)
        if b.status in until:
            return b
        time.sleep(0.3)
    raise TimeoutError(f"batch {batch_id} still {b.status} after {timeout}s")


def lines(sdk: Any, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in sdk.files.content(file_id).read().splitlines() if x]


def chat_line(i: int | str, content: str, model: str, max_tokens: int = 8) -> dict[str, Any]:
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "temperature": 0, "max_tokens": max_tokens,
                     "messages": [{"role": "user", "content": content}]}}


def held_models(embeddings: tuple[tuple[Any, Any], ...] = (),
                chats: dict[str, Any] | None = None) -> Any:
    """A worker's residency holding version 1 of each embedding model given (its model
    and engine) and of each chat model given (``name -> build()`` of its engine); it
    refuses to load anything else."""
    from typing import cast

    from jobs.core.context import Context
    from jobs.core.schema import Model
    from workers.models.residency import Residency, Resident

    def no_loads(m: Model) -> Resident:
        raise AssertionError(f"{m.name} must not be loaded")

    held = Residency(cast(Context, None), loader=no_loads)
    for model, engine in embeddings:
        held.hold(Resident(Model(name=model.model_id, version="1", kind="embeddings",
                                 files=[]), 0, inputs=model, engine=engine), "configured")
    for name, build in (chats or {}).items():
        held.hold(Resident(Model(name=name, version="1", kind="chat", files=[]), 0,
                           chat=build), "configured")
    return held


def served(call: Any, timeout: float = 300) -> Any:
    """``call()``, retried while its model is not in the API's registry snapshot yet
    (400 model_not_found) or is being loaded by the worker it was placed on (503)."""
    import openai

    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except openai.APIStatusError as e:
            waiting = e.status_code == 503 or e.code == "model_not_found"
            if not waiting or time.monotonic() > deadline:
                raise
            time.sleep(1)
