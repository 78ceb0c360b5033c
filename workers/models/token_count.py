"""Prompt tokens as the model workers count them, with the model's tokenizer alone.

Batch validation (the control worker: no weights, no accelerator) counts each valid
request's prompt tokens here, so ``batches.input_tokens`` and the project's
``batch_1_day_max_input_tokens`` see what the output lines' ``usage.prompt_tokens``
will say, not an upper bound. The tokenization rules are written once, here, and the
workers use them too (``EmbeddingModel.tokenize``, ``ChatModel.chat_ids`` and
``prompt_ids``, ``build_request``'s messages):

- embeddings: each text through the tokenizer with its special tokens ([CLS] ... [SEP]);
  a token-id input is its ids between the same two special tokens;
- chat: the messages (``developer`` as ``system``; no content as ""; an assistant's
  ``tool_calls``, a tool message's ``tool_call_id``) and the request's tools
  (``jobs.protocol.tool_use``: none when ``tool_choice`` is ``none``) through the model's
  chat template with the generation prompt;
- completions: the prompt through the tokenizer (with the special tokens it adds).

The tokenizer is the registry version's own: its tokenizer files, fetched from the
model repository with their hashes checked and kept on local disk
(``workers.models.cache.tokenizer_dir``; never the weights), loaded once per
(model, version) in a process. Loading it imports transformers' tokenizer classes but
not torch: transformers' ``AutoTokenizer`` imports torch through its config classes,
so the class that ``tokenizer_config.json`` names is loaded directly (what
``AutoTokenizer`` picks for the models served here); a directory that names no class
transformers has goes through ``AutoTokenizer``, torch and all.

No torch at import time: this module is imported by the control worker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

from jobs.core.context import Context
from jobs.core.errors import transient
from jobs.core.schema import Model
from jobs.fleet import registry
from jobs.protocol.embeddings import EmbeddingsBody
from jobs.protocol.endpoints import EMBEDDINGS
from jobs.protocol.generation import ChatBody
from jobs.protocol.parsing import parse_generation
from jobs.protocol.tool_use import tools_of
from jobs.protocol.validation import parse_model

log = logging.getLogger("inferq.tokens")


# The workers' tokenization -----------------------------------------------------------------


def template_messages(req: ChatBody) -> list[dict[str, Any]]:
    """A chat body's messages as the chat template takes them."""
    out = []
    for m in req.messages:
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                               "content": m.content or ""}
        if m.tool_calls:
            msg["tool_calls"] = [c.template() for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def template_tools(req: ChatBody) -> list[dict[str, Any]] | None:
    """The tools the chat template renders (None: none, or ``tool_choice: none``)."""
    tools = tools_of(req.model_dump(exclude_none=True))
    return tools.template() if tools is not None else None


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]],
             tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The prompt of a chat: its messages (and tools) through the template, with the
    generation prompt."""
    enc: Any = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                             tokenize=True)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    return [int(x) for x in ids]


def prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt of a completion."""
    return [int(x) for x in tokenizer(prompt)["input_ids"]]


def embedding_ids(tokenizer: Any, inputs: list[str] | list[list[int]]) -> list[list[int]]:
    """Each input's token ids with the special tokens around it (nothing truncated)."""
    if inputs and isinstance(inputs[0], list):
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        return [[cls, *ids, sep] for ids in inputs]
    enc = tokenizer(list(inputs), truncation=False, add_special_tokens=True,
                    return_attention_mask=False, verbose=False)
    return [list(ids) for ids in enc["input_ids"]]


def prompt_length(tokenizer: Any, endpoint: str, body: dict[str, Any]) -> int:
    """The prompt tokens of a valid request body (a shard row's body) for ``endpoint``:
    the ``usage.prompt_tokens`` its output line reports."""
    if endpoint == EMBEDDINGS:
        req: EmbeddingsBody = parse_model(EmbeddingsBody, body)
        return sum(map(len, embedding_ids(tokenizer, req.inputs())))
    gen = parse_generation(endpoint, body)
    if isinstance(gen, ChatBody):
        return len(chat_ids(tokenizer, template_messages(gen), template_tools(gen)))
    return len(prompt_ids(tokenizer, str(gen.prompt)))


# Loading a tokenizer without torch ---------------------------------------------------------


def load_tokenizer(path: Path) -> Any:
    """The tokenizer of a model directory, as the workers' ``AutoTokenizer`` loads it."""
    import transformers

    try:
        name = json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        name = None
    cls = _tokenizer_class(transformers, name) if isinstance(name, str) else None
    if cls is None:  # what AutoTokenizer would pick is not known here: ask it (torch)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    return cls.from_pretrained(str(path))


def _tokenizer_class(transformers: Any, name: str) -> Any:
    base = transformers.PreTrainedTokenizerBase
    for candidate in (name, name.removesuffix("Fast")):
        try:
            cls = getattr(transformers, candidate)
        except (AttributeError, ImportError):
            continue
        if isinstance(cls, type) and issubclass(cls, base):
            return cls
    return None


class Tokenizer:
    """A loaded tokenizer and the lock that makes it one caller at a time (a fast
    tokenizer refuses concurrent use)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.lock = threading.Lock()

    def count(self, endpoint: str, body: dict[str, Any]) -> int:
        with self.lock:
            return prompt_length(self.tokenizer, endpoint, body)


_lock = threading.Lock()
# (name, version, digest of its tokenizer files' hashes) -> the loaded tokenizer
_tokenizers: dict[tuple[str, str, str], Tokenizer] = {}


def tokenizer_for(ctx: Context, model: Model) -> Tokenizer:
    """The tokenizer of a registry version, loaded once per process (per content: a
    version re-published with other files is loaded again)."""
    from workers.models import cache

    files = cache.tokenizer_files(model)
    digest = hashlib.sha256("".join(sorted(f["sha256"] for f in files)).encode()).hexdigest()
    key = (model.name, model.version, digest)
    with _lock:
        hit = _tokenizers.get(key)
    if hit is not None:
        return hit
    loaded = Tokenizer(load_tokenizer(cache.tokenizer_dir(ctx, model)))
    with _lock:
        return _tokenizers.setdefault(key, loaded)


class Counter:
    """The ``count_tokens`` of one batch validation (``jobs.batches.sharding.TokenCounter``):
    the prompt tokens of a valid request body, or None where they cannot be counted
    exactly (the model's repository holds no usable tokenizer, or the tokenizer refused
    the body), and validation counts that request's upper bound instead. Each model
    name is looked up once, in the registry's default version (what the workers load).
    A backend that is unreachable raises: the validation task is retried."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.models: dict[str, Tokenizer | None] = {}

    def __call__(self, endpoint: str, body: dict[str, Any]) -> int | None:
        name = body.get("model")
        if not isinstance(name, str):
            return None
        if name not in self.models:
            self.models[name] = self._load(name)
        tok = self.models[name]
        if tok is None:
            return None
        try:
            return tok.count(endpoint, body)
        except Exception as e:  # noqa: BLE001 - e.g. a template that refuses these roles
            log.debug("%s: prompt not counted (%s); its upper bound is used", name, e)
            return None

    def _load(self, name: str) -> Tokenizer | None:
        try:
            model = registry.get_default(self.ctx, name)
            if model is None:
                return None
            return tokenizer_for(self.ctx, model)
        except Exception as e:
            if transient(e):
                raise
            log.warning("%s: no tokenizer to count prompt tokens exactly (%s: %s); batch "
                        "validation counts their upper bound", name, type(e).__name__, e)
            return None
