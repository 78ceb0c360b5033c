"""The jobs lane: asynchronous jobs (``POST /v1/jobs``) taken from their Redis list in
bursts and fed to the engines together, at a priority between realtime and batch;
each result is written back to its job row.

Leases on the rows say which worker holds a job; this consumer renews the leases of
the jobs it has in flight and re-pushes jobs whose holder died. Every claimed job
ends with its result or its error written, or is let go (no longer renewed) so that
recovery runs it again. A job's usage record (``job:<id>``) is inserted in the
transaction that stores its result, so a job run twice is billed once.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

import orjson
from sqlalchemy.exc import InterfaceError, OperationalError

from jobs.asyncjobs import lifecycle as asyncjobs
from jobs.batches.outputs import dumps
from jobs.core import lanes, redis_keys
from jobs.core.context import Context
from jobs.core.errors import InferqError
from jobs.core.schema import Job
from jobs.protocol.embeddings import EmbeddingsBody
from jobs.protocol.endpoints import EMBEDDINGS, RESPONSES
from jobs.protocol.parsing import parse_embeddings
from jobs.protocol.responses_request import as_chat
from jobs.protocol.tool_use import tools_of
from jobs.tenants import usage
from workers.engines import responses as bodies
from workers.engines.embeddings import RowFuture, seconds_of, when_all_done
from workers.engines.request import build_request
from workers.engines.scheduling import JOBS
from workers.engines.sinks import Collect

if TYPE_CHECKING:  # torch-bound (a simulated worker never imports torch)
    from workers.models.residency import Residency

log = logging.getLogger("inferq.jobs_lane")


class JobsConsumer(threading.Thread):
    """Started in a pool child that serves the jobs lane: takes the jobs of the model
    versions it holds (``models``: one Redis list per version); ``allow`` is false
    while the circuit breaker is open."""

    burst = 64

    def __init__(self, ctx: Context, models: Residency, worker: str,
                 allow: Callable[[], bool], recover_every_s: float = 15.0) -> None:
        super().__init__(name="inferq-jobs", daemon=True)
        self.ctx, self.models = ctx, models
        self.worker, self.allow, self.recover_every_s = worker, allow, recover_every_s
        self.token = secrets.token_hex(16)
        self.writer = ThreadPoolExecutor(2, thread_name_prefix="inferq-jobs-write")
        self.stopping = threading.Event()
        self._in_flight: set[str] = set()  # claimed, outcome not written yet
        self._lock = threading.Lock()

    def stop(self) -> None:
        """Called at shutdown, after the engines stopped: take no more jobs and let the
        writes already queued finish."""
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=5)
        self.writer.shutdown(wait=True)

    def in_flight(self) -> list[str]:
        """The ids of the jobs this consumer holds: claimed, outcome not written yet."""
        with self._lock:
            return sorted(self._in_flight)

    def run(self) -> None:
        last_recover = 0.0
        ttl = self.ctx.settings.lease_seconds
        while not self.stopping.is_set():
            try:
                if time.monotonic() - last_recover > min(self.recover_every_s, ttl / 3):
                    asyncjobs.renew(self.ctx, self.token, ttl, self.in_flight())
                    asyncjobs.recover(self.ctx)
                    last_recover = time.monotonic()
                if not self.allow():
                    time.sleep(0.5)
                    continue
                self.take_burst()
            except Exception as e:  # noqa: BLE001 - keep consuming; recovery re-pushes
                log.warning("jobs lane: %s", e)
                time.sleep(1)

    def take_burst(self) -> None:
        """Wait up to a second for a job id, take up to ``burst`` of them, claim them and
        start each; a job that cannot start fails alone."""
        r = self.ctx.redis  # bytes replies: the client does not decode
        # Its versions' lists, then the common one (jobs for versions nobody can hold).
        queues = [redis_keys.jobs_queue(m) for m in self.models.refs()] + [redis_keys.JOBS_QUEUE]
        got = r.blpop(queues, timeout=1)
        if got is None:
            return
        if self.handed_back(cast(bytes, got[0]), cast(bytes, got[1])):
            return
        more = cast(list[bytes] | None, r.lpop(got[0], self.burst - 1))
        ids = [x.decode() for x in [cast(bytes, got[1]), *(more or [])]]
        jobs = asyncjobs.claim(self.ctx, ids, self.worker, self.token,
                               self.ctx.settings.lease_seconds)
        with self._lock:
            self._in_flight.update(j.id for j in jobs)
        for job in jobs:
            try:
                self.start_job(job)
            except Exception as e:  # noqa: BLE001 - recorded on the job; the burst goes on
                log.exception("job %s could not start", job.id)
                self.finish(job.id, None, bodies.failure(e)[1])

    def handed_back(self, queue: bytes, job_id: bytes) -> bool:
        """A job popped from the list of a version this worker no longer holds (unloaded
        while the pop was waiting) goes back to the head of that list, unclaimed, for
        the worker that holds it or is loading it; True when it did."""
        name = queue.decode()
        if name == redis_keys.JOBS_QUEUE or name in {redis_keys.jobs_queue(m)
                                               for m in self.models.refs()}:
            return False
        self.ctx.redis.lpush(name, job_id)  # BLPOP takes from the left: next in line
        log.info("jobs lane: job %s handed back (%s is no longer held here)",
                 job_id.decode(), name[len(redis_keys.jobs_queue("")):])
        return True

    def start_job(self, job: Job) -> None:
        if job.endpoint == EMBEDDINGS:
            self.start_embeddings(job)
            return
        if job.endpoint == RESPONSES:
            self.start_response(job)
            return
        try:
            gen = self.models.chat(job.body["model"], job.model_version)
            greq = build_request(gen.model, job.endpoint, job.body)
        except InferqError as e:
            self.finish(job.id, None, e.to_dict())
            return
        sink = Collect(on_done=lambda c: self.writer.submit(self.finish_generation, job, c))
        gen.submit(greq, sink, JOBS)

    def start_embeddings(self, job: Job) -> None:
        try:
            req = parse_embeddings(job.body, 1 << 30)
            res = self.models.embedder(req.model, job.model_version)
            assert res.inputs is not None and res.engine is not None
            ids = res.inputs.prepare(req)  # refuses what the model cannot serve
        except InferqError as e:
            self.finish(job.id, None, e.to_dict())
            return
        futures = res.engine.submit(ids, JOBS)
        when_all_done(futures, lambda: self.writer.submit(
            self.finish_embeddings, job, req, futures, sum(map(len, ids))))

    def finish_embeddings(self, job: Job, req: EmbeddingsBody,
                          futures: list[RowFuture], ntok: int) -> None:
        try:
            body = bodies.embeddings_body(req, [f.result() for f in futures], ntok)
            result = orjson.loads(dumps(body))
        except Exception as e:  # noqa: BLE001 - recorded on the job
            self.record(job.id, None, bodies.failure(e)[1])
            return
        self.record(job.id, result, None, self.bill(job, ntok, 0, seconds_of(futures)))

    def finish_generation(self, job: Job, c: Collect) -> None:
        if c.error is not None:
            self.record(job.id, None, bodies.failure(c.error)[1])
            return
        u = c.usage  # every choice's tokens (best_of's included), the prompt once
        body = bodies.generation_body(job.endpoint, job.body["model"], c.choices,
                               bodies.top_count(job.endpoint, job.body), u.prompt_tokens,
                               u.completion_tokens, tools_of(job.body))
        body["inferq"] = {"batch_rows": u.batch_rows}
        self.record(job.id, body, None,
                    self.bill(job, u.prompt_tokens, u.completion_tokens, u.accelerator_s))

    def start_response(self, job: Job) -> None:
        """A /v1/responses job: run as its chat request
        (jobs.protocol.responses_request.as_chat), its result the Response object."""
        try:
            gen = self.models.chat(job.body["model"], job.model_version)
            greq = build_request(gen.model, *as_chat(job.endpoint, job.body))
        except InferqError as e:
            self.finish(job.id, None, e.to_dict())
            return
        sink = Collect(on_done=lambda c: self.writer.submit(self.finish_response, job, c))
        gen.submit(greq, sink, JOBS)

    def finish_response(self, job: Job, c: Collect) -> None:
        if c.error is not None:
            self.record(job.id, None, bodies.failure(c.error)[1])
            return
        u = c.usage
        body = bodies.response_object(job.body, c.text, c.reason, u.prompt_tokens,
                               u.completion_tokens)
        body["inferq"] = {"batch_rows": u.batch_rows}
        self.record(job.id, body, None,
                    self.bill(job, u.prompt_tokens, u.completion_tokens, u.accelerator_s))

    def bill(self, job: Job, input_tokens: int, output_tokens: int, seconds: float
             ) -> usage.Entry:
        """The usage record of a job that succeeded, billed to the key that created it."""
        return usage.entry(self.ctx.settings, source=f"job:{job.id}", tenant_id=job.tenant_id,
                           api_key_id=job.api_key_id, kind=usage.kind_of(job.endpoint),
                           model=str(job.body.get("model", "")), lane=lanes.JOBS,
                           input_tokens=input_tokens, output_tokens=output_tokens,
                           accelerator_seconds=seconds)

    def finish(self, job_id: str, result: dict[str, Any] | None,
               error: dict[str, Any] | None) -> None:
        """Write a job's outcome off the calling (engine or consumer) thread."""
        self.writer.submit(self.record, job_id, result, error)

    def record(self, job_id: str, result: dict[str, Any] | None,
               error: dict[str, Any] | None, bill: usage.Entry | None = None) -> None:
        """Write a job's outcome (on the writer pool), then stop renewing its lease.

        An outcome the database refuses becomes the job's error; when the database
        cannot be reached the job is let go, and recovery runs it again once its
        lease lapses."""
        try:
            asyncjobs.complete(self.ctx, job_id, self.token, result, error, bill)
        except (OperationalError, InterfaceError) as e:
            log.warning("job %s: outcome not written (%s); left to recovery", job_id, e)
        except Exception as e:  # noqa: BLE001 - e.g. a value JSONB cannot hold
            log.exception("job %s: outcome refused by the database", job_id)
            self._record_unstorable(job_id, e)
        finally:
            with self._lock:
                self._in_flight.discard(job_id)

    def _record_unstorable(self, job_id: str, e: Exception) -> None:
        err = {"message": f"the job's outcome could not be stored ({type(e).__name__})",
               "type": "server_error", "param": None, "code": "server_error"}
        try:
            asyncjobs.complete(self.ctx, job_id, self.token, None, err)
        except Exception as e2:  # noqa: BLE001 - left to recovery
            log.warning("job %s: error not written (%s); left to recovery", job_id, e2)
