"""A model version's precision, applied to its weights when a worker loads them.

- ``fp32``: the weights as stored, on any device.
- ``bf16`` / ``fp16``: the weights cast on a GPU. A CPU worker refuses such a version
  (``PrecisionUnavailable``): CPUs without bf16 matrix units run these slower than
  fp32, and fp16 kernels are missing for several CPU operations.
- ``int8``: dynamic quantization of the linear layers (``torch.ao.quantization.
  quantize_dynamic``: int8 weights with a scale per output channel, activations
  quantized per batch at run time) on a CPU. Per channel rather than per tensor: for
  all-MiniLM-L6-v2, cosine similarity to fp32 of 0.97–0.98 instead of 0.94–0.96.
  A GPU worker refuses it: those kernels are CPU kernels.

Embeddings come back as float32 whatever the precision (the engine normalises them in
float32); generation samples from float32 logits.
"""

from __future__ import annotations

import warnings
from typing import TypeVar, cast

import torch

from jobs.fleet.registry import FP32, PRECISIONS

M = TypeVar("M", bound=torch.nn.Module)
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


class PrecisionUnavailable(RuntimeError):
    """This worker's device cannot serve the version in its precision."""


def check(precision: str, device: torch.device) -> None:
    if precision not in PRECISIONS:
        raise PrecisionUnavailable(f"unknown precision {precision!r} "
                                   f"(one of {', '.join(PRECISIONS)})")
    if precision in HALF and device.type != "cuda":
        raise PrecisionUnavailable(f"{precision} is served by GPU workers; this worker runs on "
                                   f"{device.type}: serve an fp32 or int8 version here")
    if precision == "int8" and device.type != "cpu":
        raise PrecisionUnavailable("int8 (dynamic quantization) is served by CPU workers; "
                                   f"this worker runs on {device.type}: serve an fp32, bf16 "
                                   "or fp16 version here")


def apply(model: M, precision: str, device: torch.device) -> M:
    """``model`` (fp32, in eval mode, on ``device``) in ``precision``."""
    check(precision, device)
    if precision == FP32:
        return model
    if precision in HALF:
        return model.to(HALF[precision])
    with warnings.catch_warnings():  # torch announces a successor API for these kernels
        warnings.simplefilter("ignore", UserWarning)
        spec = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        return cast(M, torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8))
