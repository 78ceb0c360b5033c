"""OpenAI-shaped response bodies built from engine results (batch output lines: jobs.outputs)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from jobs.errors import InferqError
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


def failure(e: BaseException) -> tuple[int, dict[str, Any]]:
    """The HTTP status and OpenAI error object for an inference that raised.

    MemoryError reaches a request only after it was tried alone (the engines split
    batches that run out of memory), so it is the request's size, not a fault. An
    InferqError carries its own status: the engines' for a request whose input could
    not be computed (``workers.embedding_engine.blame``) is a 400."""
    if isinstance(e, InferqError):
        return e.status, e.to_dict()
    if isinstance(e, MemoryError):
        return 413, {"message": str(e), "type": "invalid_request_error", "param": None,
                     "code": "request_too_large"}
    return 500, {"message": f"inference failed: {e}", "type": "server_error", "param": None,
                 "code": "server_error"}

