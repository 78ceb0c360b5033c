"""The only place that knows the object-store key layout."""


def file_object(file_id: str) -> str:
    return f"files/{file_id}"


def upload_prefix(upload_id: str) -> str:
    """The parts of an upload (``POST /v1/uploads``) until it is completed or cancelled."""
    return f"uploads/{upload_id}/"


def upload_part(upload_id: str, part_id: str) -> str:
    return f"{upload_prefix(upload_id)}{part_id}"


def upload_target(upload_id: str) -> str:
    """The object an upload's parts go into in place (a store with multipart uploads):
    the File's object when completing keeps them in the order they came, else the
    source its parts are copied from in their order. It lies among the Files' objects,
    named by the upload's id (the File's row keeps its key)."""
    return file_object(upload_id)


def batch_prefix(batch_id: str) -> str:
    return f"batches/{batch_id}/"


def batch_shards(batch_id: str) -> str:
    """The prefix of a batch's shards (its requests, as validated)."""
    return f"{batch_prefix(batch_id)}shards/"


def batch_parts(batch_id: str) -> str:
    """The prefix of a batch's committed output and error parts."""
    return f"{batch_prefix(batch_id)}parts/"


def shard_input(batch_id: str, index: int) -> str:
    return f"{batch_shards(batch_id)}{index:06d}.parquet"


def validation_errors(batch_id: str) -> str:
    return f"{batch_prefix(batch_id)}validation-errors.jsonl"


def output_part(batch_id: str, shard_index: int, chunk: int, kind: str,
                attempt: int | None = None) -> str:
    """One key per (shard, chunk, attempt that wrote it): a worker whose lease lapsed
    and that writes its chunk late never overwrites the part another attempt committed
    (the checkpoint records which attempt committed each chunk). ``attempt`` None is
    the layout of parts committed before attempts were recorded: (shard, chunk) only."""
    tried = "" if attempt is None else f".a{attempt:06d}"
    return f"{shard_parts_prefix(batch_id, shard_index)}{chunk:06d}{tried}.{kind}.jsonl"


def resume_tokens(batch_id: str, shard_index: int, chunk: int, attempt: int) -> str:
    """The tokens a generation shard's unfinished rows had generated when ``attempt``
    committed ``chunk`` (jobs/batches/resume.py), beside that chunk's parts."""
    return (f"{shard_parts_prefix(batch_id, shard_index)}{chunk:06d}.a{attempt:06d}"
            ".resume.json.gz")


def shard_parts_prefix(batch_id: str, shard_index: int) -> str:
    return f"{batch_parts(batch_id)}{shard_index:06d}/"


def batch_output(batch_id: str, kind: str, fmt: str) -> str:
    return f"{batch_prefix(batch_id)}{kind}.{fmt}"


def model_prefix(name: str, version: str) -> str:
    """The model repository: every file of one model version lives under this prefix."""
    return f"models/{name}/{version}/"


def model_file(name: str, version: str, path: str) -> str:
    """``path`` is relative to the model directory (posix separators)."""
    return model_prefix(name, version) + path


def model_manifest(name: str, version: str) -> str:
    """The manifest of a version's files, written after them (model files never start
    with a dot): a store that has it holds every file it lists."""
    return model_prefix(name, version) + ".manifest.json"
