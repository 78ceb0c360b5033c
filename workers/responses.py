"""OpenAI-shaped response bodies and batch output lines built from engine results."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson

from jobs.models import new_id
from jobs.requests import EmbeddingsBody


def embeddings_body(req: EmbeddingsBody, vectors: list[np.ndarray], tokens: int) -> dict[str, Any]:
    data = []
    for i, v in enumerate(vectors):
        if req.dimensions is not None and req.dimensions < len(v):
            v = v[: req.dimensions]
            v = v / max(float(np.linalg.norm(v)), 1e-12)
        v = np.asarray(v, dtype="<f4")
        emb: Any = base64.b64encode(v.tobytes()).decode() if req.encoding_format == "base64" else v
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return {"object": "list", "data": data, "model": req.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def ok_line(custom_id: str, body: dict[str, Any]) -> bytes:
    return dumps({"id": new_id("batch_req_"), "custom_id": custom_id,
                  "response": {"status_code": 200, "request_id": new_id("req_"), "body": body},
                  "error": None}) + b"\n"


def http_error_line(custom_id: str, status: int, message: str, code: str,
                    etype: str = "server_error") -> bytes:
    return dumps({"id": new_id("batch_req_"), "custom_id": custom_id,
                  "response": {"status_code": status, "request_id": new_id("req_"),
                               "body": {"error": {"message": message, "type": etype,
                                                  "param": None, "code": code}}},
                  "error": None}) + b"\n"
