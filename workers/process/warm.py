"""What the model workers' fork server imports once (``workers.process.forked``): the
libraries a model worker needs before it can load a model. Third-party modules only:
nothing here reads inferq's settings, which belong to each forked worker."""

from __future__ import annotations

import contextlib
import os

# The fork server leads a session of its own, as its workers do: a signal to the
# stack's process group (Ctrl-C, an orchestrator's SIGTERM) is the stack's to handle,
# and the stack stops the fork server once the workers forked from it have stopped
# (cli.stack; cli.lifeline should the stack die first).
with contextlib.suppress(OSError):
    os.setsid()

# huggingface_hub reads this when imported; every stack child runs offline (cli.stack).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import billiard  # noqa: E402,F401
import boto3  # noqa: E402,F401
import celery.bin.celery  # noqa: E402,F401
import kombu  # noqa: E402,F401
import pyarrow.parquet  # noqa: E402,F401
import redis  # noqa: E402,F401
import sqlalchemy.orm  # noqa: E402,F401
import torch  # noqa: E402,F401
import transformers  # noqa: E402,F401
