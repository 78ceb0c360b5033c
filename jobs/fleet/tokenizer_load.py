"""A model folder's tokenizer loaded before anything of the folder is published.

A tokenizer the workers cannot load makes a version that never serves (every request
``model_not_loaded``), so ``models add`` loads it first with ``tokenizers`` (Rust,
no torch, no transformers: what a fast tokenizer is built on), the way the workers'
``AutoTokenizer`` reads the folder:

- ``tokenizer.json``: the whole tokenizer, loaded, then made to encode a sentence;
- else the vocabulary ``tokenizer_config.json`` goes with: ``vocab.txt`` as a
  WordPiece vocabulary, ``vocab.json`` + ``merges.txt`` as BPE, ``vocab.json`` as a
  word-level vocabulary, a sentencepiece model through ``sentencepiece`` (where it is
  installed: the workers need it to read one too).

What does not load is ``Refused``, naming the file and what its loader said.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from jobs.core.errors import shown
from jobs.fleet.folders import Folder, Refused

SAMPLE = "Hello, world: a sentence to check that the tokenizer encodes text."
SENTENCEPIECE = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model")


def check_tokenizer(folder: Folder) -> None:
    """Refused unless the folder's tokenizer loads (see the module)."""
    if folder.has("tokenizer.json"):
        _tokenizer_json(folder)
        return
    if folder.has("vocab.txt"):
        _vocabulary(folder, ("vocab.txt",))
    elif folder.has("vocab.json") and folder.has("merges.txt"):
        _vocabulary(folder, ("vocab.json", "merges.txt"))
    elif folder.has("vocab.json"):
        _vocabulary(folder, ("vocab.json",))
    else:
        for name in SENTENCEPIECE:
            if folder.has(name):
                _sentencepiece(folder, name)
                return


def _loads(what: str, load: Callable[[], object]) -> None:
    """``load()``; Refused with the loader's first line when it raises (a Rust panic
    in ``tokenizers`` is a BaseException: it is the folder's too)."""
    try:
        load()
    except Exception as e:  # noqa: BLE001 - whatever the loader says is the folder's fault
        raise Refused(f"{what} does not load as a tokenizer: {_said(e)}") from None
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise Refused(f"{what} does not load as a tokenizer: {_said(e)}") from None


def _said(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return shown(lines[0], 200)[1:-1] if lines else type(e).__name__


def _read(folder: Folder, rel: str) -> bytes:
    try:
        return folder.read(rel)
    except OSError as e:
        raise Refused(f"cannot read {rel}: {e.strerror or e}") from None


def _tokenizer_json(folder: Folder) -> None:
    from tokenizers import Tokenizer

    raw = _read(folder, "tokenizer.json")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise Refused("tokenizer.json is not UTF-8 text") from None
    _loads("tokenizer.json", lambda: Tokenizer.from_str(text).encode(SAMPLE))


def _vocabulary(folder: Folder, names: tuple[str, ...]) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import BPE, Model, WordLevel, WordPiece

    with tempfile.TemporaryDirectory(prefix="inferq-vocab-") as tmp:
        paths = []
        for rel in names:
            p = Path(tmp) / rel
            p.write_bytes(_read(folder, rel))
            paths.append(str(p))

        def load() -> None:
            model: Model
            if names == ("vocab.txt",):
                model = WordPiece.from_file(paths[0], unk_token="[UNK]")
            elif len(names) == 2:
                model = BPE.from_file(paths[0], paths[1])
            else:
                model = WordLevel.from_file(paths[0], unk_token="<unk>")
            if Tokenizer(model).get_vocab_size() == 0:
                raise ValueError("the vocabulary is empty")

        _loads(" + ".join(names), load)


def _sentencepiece(folder: Folder, name: str) -> None:
    try:
        import sentencepiece
    except ImportError:  # not installed here: the workers' load is the check
        return
    proto = _read(folder, name)

    def load() -> None:
        sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
        if sp.get_piece_size() == 0:
            raise ValueError("the model has no pieces")

    _loads(name, load)
