"""Generation on vLLM's engine, its core in a process of its own.

One thread owns a ``vllm.v1.engine.llm_engine.LLMEngine`` built in this process; its
engine core (the model, its key/value cache and vLLM's process-wide state) runs in a
child process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, ``workers.engines.vllm_setup``), so
a version vLLM fails to build, or whose core crashes, leaves every other version's
engine as it was; the worker's leases, heartbeats and signals stay in the worker. The
thread moves what
the lanes submitted into vLLM (``add_request`` with the request's priority: vLLM's
priority scheduling serves realtime, 0, first), aborts what its caller no longer
wants, and steps the engine; each step's outputs (``RequestOutputKind.DELTA``: the new
text and tokens) are delivered to the sinks as the transformers engine delivers them
(``workers.engines.sinks``: ``start``, ``delta``, ``finish`` with the usage, ``fail``).

Rows for realtime: vLLM preempts running sequences only when its key/value cache is
full, never to free a row, so batch work (jobs, shards, flex) is let into vLLM up to
``max_batch_rows`` sequences while vLLM runs up to ``max_rows``: realtime requests
always find a row free at the next step. Batch work beyond that waits here, by
priority, then arrival.

Several choices (``n``, ``best_of``), log probabilities or an echo: the request's
``best_of`` sequences are vLLM requests of their own (sequence i seeded seed + i, as on
the transformers engine), told to the request's sink as choices by the same
``workers.engines.fanout.Fan``. Log probabilities are vLLM's processed ones
(``workers.engines.vllm_requests``).

One request's failure is its own: vLLM refuses a request it cannot take when it is
added (400, to that request alone). A step that raises is the engine's failure, not
its requests': vLLM's core is dead then (it ends on an error in a step; killed, it is
seen by ``_watch_core``). The engine is broken (``broken``): ``on_broken`` is told first
(the worker trips its breaker, so the batch work in it is handed back, and builds the
version again), then everything it held or is given fails with ``EngineBroken`` (503),
the server's failure, never the row's.

Usage per request: its prompt and generated tokens, the prompt tokens vLLM took from
its prefix cache (``cached_tokens``), the most rows of any step it took part in, and
its share of each step's time (split among the step's requests by the tokens each
computed in it, its uncached prompt in its first step).

vLLM is configured for this process before it is imported
(``workers.engines.vllm_setup``).
"""

from __future__ import annotations

import codecs
import gc
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.core.errors import InvalidRequest, Unavailable
from jobs.tenants.usage import split
from workers.engines.fanout import Branch
from workers.engines.request import GenRequest
from workers.engines.responses import TokenLogprob
from workers.engines.scheduling import (
    REALTIME,
    PriorityQueued,
    ceiling,
    fair_index,
    project_of,
    take,
)
from workers.engines.sinks import FinishReason, Sink
from workers.engines.stats import GenStats
from workers.engines.token_texts import TokenTexts
from workers.engines.vllm_requests import (
    VllmRequest,
    finite,
    prompt_logprobs,
    sampling_params,
    token_logprob,
)
from workers.engines.vllm_setup import (
    context_proxies_set_aside,
    core_process,
    core_processes,
    environment,
    watch_core,
)
from workers.models.chat import ChatTokens

log = logging.getLogger("inferq.vllm")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit (completions: 5)


class EngineBroken(Unavailable):
    """The engine running the request failed (not the request): it is being rebuilt; the
    request may be sent again."""


class VllmEngine(PriorityQueued[VllmRequest]):
    """The generation engine interface (``submit``, ``load``, ``stop``, ``stats``,
    ``model``, ``max_rows``) over vLLM. Built (weights loaded, key/value cache
    allocated) by its own thread; the constructor returns once it is ready, or raises
    what stopped it."""

    name = "vllm"
    stop_s = 30.0  # the loop shuts vLLM's engine core down as it ends

    def __init__(self, model: ChatTokens, path: Path, precision: str = "fp32",
                 max_batch_rows: int = 32, max_rows: int = 64, kv_cache_bytes: int = 1 << 30,
                 enforce_eager: bool | None = None,
                 on_step: Callable[[int, float], None] | None = None,
                 on_pass: Callable[[bool], None] | None = None,
                 on_broken: Callable[[BaseException], None] | None = None) -> None:
        if precision not in DTYPES:
            raise ValueError(f"the vllm engine serves {', '.join(DTYPES)} weights, not "
                             f"{precision} (the transformers engine serves {precision})")
        super().__init__()
        self.model = model
        self.max_batch_rows, self.max_rows = max_batch_rows, max_rows
        self.on_step, self.on_pass, self.on_broken = on_step, on_pass, on_broken
        self.broken: EngineBroken | None = None  # set once its core failed
        self.stats = GenStats()
        self._args: dict[str, Any] = {
            "model": str(path), "tokenizer": str(path), "dtype": DTYPES[precision],
            "max_model_len": model.context_length, "max_num_seqs": max_rows,
            "enable_prefix_caching": True, "scheduling_policy": "priority",
            "logprobs_mode": "processed_logprobs", "max_logprobs": MAX_LOGPROBS,
            "kv_cache_memory_bytes": kv_cache_bytes, "disable_log_stats": True,
            # the process's global RNGs are seeded with it: not a fixed one
            "seed": int.from_bytes(os.urandom(4), "little"), "enforce_eager": enforce_eager}
        self._texts = TokenTexts(model.tokenizer)
        self._live: dict[str, VllmRequest] = {}
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._llm: Any = None
        self._closing = threading.Event()
        self._start_loop(self._run, "inferq-vllm")
        self._ready.wait()
        if self._error is not None:
            raise self._error

    # The interface -------------------------------------------------------------------------
    def load(self) -> tuple[int, int]:
        """(running, waiting) sequences."""
        with self._cond:
            return len(self._live), len(self._waiting)

    def clear_cache(self) -> bool:
        """Empty vLLM's prefix cache, when nothing runs (benchmarks, between rounds)."""
        with self._cond:
            return not self._live and not self._waiting and bool(
                self._llm.reset_prefix_cache())

    # Building ------------------------------------------------------------------------------
    def _build(self) -> None:
        import torch

        # On CPUs the core's processes (its scheduler, and the worker computing the model)
        # wait for each other by spinning: the model's threads leave them a core.
        threads = torch.get_num_threads()
        environment(threads if torch.cuda.is_available() else max(1, threads - 1))
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        args = dict(self._args)
        # structured outputs by the library the API checks schemas with (llguidance)
        args["structured_outputs_config"] = StructuredOutputsConfig(backend="guidance")
        if args["enforce_eager"] is None:  # graphs pay off on a GPU; on CPUs they cost
            args["enforce_eager"] = not torch.cuda.is_available()  # a minute of compiling
        # vLLM's CPU worker replaces torch.set_num_threads for the whole process with a
        # function that refuses; the embedding engine and torch's own callers need it.
        set_threads = torch.set_num_threads
        try:
            with context_proxies_set_aside(), core_process():
                self._llm = LLMEngine.from_engine_args(EngineArgs(**args))
        finally:
            torch.set_num_threads = set_threads
        self._watch_core()
        self._warm_up()

    def _watch_core(self) -> None:
        """vLLM's client waits for its core's outputs without a bound: a core killed (out
        of memory, a signal) would hold the loop's step for ever (``watch_core``)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        def exited(how: str) -> None:
            if not self._closing.is_set():
                log.error("vLLM engine core of %s exited (%s)", self.model.model_id, how)
                self._break(EngineDeadError())  # (an idle loop learns it now)

        watch_core(self._llm, exited, EngineDeadError)

    def core_pids(self) -> list[int]:
        """The processes of this engine's core (tests, diagnostics)."""
        return [int(p.pid) for p in core_processes(self._llm)]

    def _warm_up(self) -> None:
        """One token generated at load: a model vLLM loads but cannot run here (an
        attention shape its kernels for this device lack) fails now, not on a request."""
        from vllm import SamplingParams

        self._llm.add_request("warm-up", {"prompt_token_ids": [self.model.pad_id]},
                              SamplingParams(max_tokens=1, temperature=0))
        while self._llm.has_unfinished_requests():
            self._llm.step()

    def _new(self, req: GenRequest, sink: Sink, priority: int, seed: int | None) -> VllmRequest:
        order = next(self._order)
        return VllmRequest(f"r{order}", req, sink, priority, order, seed,
                    decoder=codecs.getincrementaldecoder("utf-8")("replace"))

    # The loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._build()
        except BaseException as e:  # noqa: BLE001 - raised by the constructor
            self._error = e
            self._shut_down()  # built, then failed its warm-up
            self._ready.set()
            return
        self._ready.set()
        while True:
            with self._cond:
                if not self._await_work() or self.broken is not None:
                    break
                admitted = self._admit()
            for r in admitted:
                self._add(r)
            self._drop_cancelled()
            if self._live:
                self._step()
        self._close(self.broken)

    def _has_work(self) -> bool:
        return bool(self._waiting or self._live or self.broken)

    def _admit(self) -> list[VllmRequest]:
        """Called under the lock: the waiting requests vLLM takes now, in priority order
        (batch work up to ``max_batch_rows``, realtime up to ``max_rows``; the rows past
        ``scheduling.ceiling`` only for a project holding none: vLLM frees no row for
        another project's request)."""
        out: list[VllmRequest] = []
        rows = len(self._live)
        batch = sum(r.priority != REALTIME for r in self._live.values())
        held = Counter(project_of(r) for r in self._live.values() if r.priority == REALTIME)
        while self._waiting:
            i = fair_index(self._waiting, held)  # realtime: fairly by project
            prio, _, r = self._waiting[i]
            realtime = prio == REALTIME
            if rows >= self.max_rows or (not realtime and batch >= self.max_batch_rows) or (
                    realtime and held[project_of(r)] > 0 and rows >= ceiling(self.max_rows)):
                break
            take(self._waiting, i)
            held[project_of(r)] += prio == REALTIME
            if r.sink.cancelled():  # its caller went away while it waited
                self._abandon(r)
                continue
            out.append(r)
            rows += 1
            batch += prio != REALTIME
        return out

    def _add(self, r: VllmRequest) -> None:
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            self._llm.add_request(r.id, {"prompt_token_ids": r.req.prompt + r.req.resume},
                                  sampling_params(r),
                                  priority=r.priority)
        except EngineDeadError as e:  # the engine's failure, not this request's
            self._break(e)
            r.done = True
            r.sink.fail(self.broken or e)
            return
        except (ValueError, VLLMClientError) as e:  # vLLM's refusal of this request alone
            r.done = True
            r.sink.fail(InvalidRequest(f"the engine cannot take this request: {e}"))
            return
        except Exception as e:  # noqa: BLE001 - this request's, and its only
            r.done = True
            r.sink.fail(e)
            return
        r.added = True
        self._live[r.id] = r

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self._llm.step()
        except Exception as e:  # noqa: BLE001 - the engine's failure: it is broken
            self._break(e)
            return
        dt = time.perf_counter() - t0
        seen: list[tuple[VllmRequest, Any]] = []
        for o in outputs:
            r = self._live.get(o.request_id)
            if r is not None and not r.done and o.outputs:
                seen.append((r, o))
        charged = []
        for r, o in seen:
            new = len(o.outputs[0].token_ids)
            if not r.started:  # its prompt was computed in this step, less vLLM's cached part
                r.cached = int(o.num_cached_tokens or 0)
                self.stats.prefills += 1
                computed = len(r.req.prompt) + len(r.req.resume) - r.cached
                self.stats.prefill_tokens += computed
                self.stats.cached_tokens += r.cached
                new += computed
            r.rows = max(r.rows, len(self._live))
            charged.append(max(new, 1))
        for (r, _), share in zip(seen, split(dt, charged), strict=True):
            r.accel_s += share
        for r, o in seen:
            self._deliver(r, o)
        self.stats.steps += 1
        self.stats.step_s += dt
        self.stats.recent_steps.append(dt)
        self.stats.max_rows = max(self.stats.max_rows, len(seen))
        if self.on_step is not None:
            self.on_step(len(seen), dt)
        if self.on_pass is not None:
            self.on_pass(True)

    def _break(self, e: Exception) -> None:
        """A step raised: vLLM's core is gone. Its breaker hears it before any request
        fails (so their batch work is handed back, not written as failed rows); the loop
        then ends, failing what it holds and everything submitted after."""
        with self._cond:  # (a build that failed is not a broken engine)
            if self.broken is not None or self._closing.is_set() or not self._ready.is_set():
                return
            self.broken = EngineBroken(f"the engine serving {self.model.model_id} failed "
                                       f"({type(e).__name__}: {e}) and is being rebuilt; "
                                       "send the request again")
            self._cond.notify()
        log.error("vLLM engine of %s failed: %s: %s; its requests are failed as the "
                  "server's, and it is rebuilt", self.model.model_id, type(e).__name__, e)
        if self.on_broken is not None:
            try:
                self.on_broken(e)
            except Exception:  # noqa: BLE001 - its requests are failed all the same
                log.exception("reporting the failed engine of %s", self.model.model_id)

    def _enqueue(self, *items: VllmRequest) -> None:
        with self._cond:  # (its lock is reentrant)
            broken = self.broken
            if broken is None:
                super()._enqueue(*items)
                return
        for r in items:  # (a request that reached the engine after it broke)
            r.done = True
            r.sink.fail(broken)

    # Delivery ------------------------------------------------------------------------------
    def _deliver(self, r: VllmRequest, o: Any) -> None:
        c = o.outputs[0]
        head = ""  # a resumed request's earlier tokens: the start of its text
        if not r.started:
            head = self.model.decode(r.req.resume) if r.req.resume else ""
            r.started = True
            fan = r.sink.fan if isinstance(r.sink, Branch) else None
            if fan is not None and fan.prompt is None and r.req.echo \
                    and r.req.logprobs is not None:
                fan.prompt = prompt_logprobs(self._texts, r.req, o.prompt_logprobs)
            r.sink.start()
        r.generated.extend(c.token_ids)
        tokens: list[TokenLogprob] | None = None
        if c.logprobs:  # asked for, or best_of's ranking
            tokens = [] if r.req.logprobs is not None else None
            for tid, entry in zip(c.token_ids, c.logprobs, strict=True):
                lp = finite(entry[tid].logprob) if tid in entry else None
                if lp is not None:
                    r.logprob_sum += lp
                start = r.chars  # (offsets only where reported)
                if tokens is None:
                    continue
                r.chars += len(r.decoder.decode(bytes(self._texts(tid)[1])))
                if tid not in self.model.eos_ids:
                    tokens.append(token_logprob(self._texts, tid, lp, entry, r.req,
                                                len(r.req.text) + start))
        self.stats.tokens += len(c.token_ids)
        by = self.stats.tokens_by_priority
        by[r.priority] = by.get(r.priority, 0) + len(c.token_ids)
        text = head + (c.text or "")
        r.text += len(text)
        r.track(text, c.stop_reason)
        if tokens is not None and c.finish_reason == "stop" and isinstance(c.stop_reason, str):
            end = len(r.req.text) + r.text  # tokens past a stop string are not reported
            tokens = [t for t in tokens if t.offset < end]
        if isinstance(r.sink, Branch):
            if text or tokens:
                r.sink.piece(text, tokens)
        elif text:
            r.sink.delta(text)
        if o.finished:
            self._end(r, c.finish_reason)

    def _end(self, r: VllmRequest, reason: str | None) -> None:
        r.done = True
        self._live.pop(r.id, None)
        if reason == "abort":  # aborted by vLLM itself, not by its caller
            r.sink.fail(RuntimeError("the engine aborted this request"))
            return
        if (failed := r.failed(reason)) is not None:  # never "stop" on a broken answer
            r.sink.fail(failed)
            return
        r.sink.finish(FinishReason.LENGTH if reason == "length" else FinishReason.STOP,
                      r.usage())


    # Leaving -------------------------------------------------------------------------------
    def _drop_cancelled(self) -> None:
        gone = [r for r in self._live.values() if r.sink.cancelled()]
        if not gone:
            return
        self._llm.abort_request([r.id for r in gone])
        for r in gone:
            self._live.pop(r.id, None)
            self._abandon(r)

    def _abandon(self, r: VllmRequest) -> None:
        """``r`` is dropped because its caller went away: a sink that bills abandoned
        work (``abandoned(usage)``) is told what it used until then."""
        r.done = True
        abandoned = getattr(r.sink, "abandoned", None)
        if abandoned is not None and r.added:  # (a fan's branch that never ran is
            abandoned(r.usage())  # settled by the fan when it says it was cancelled)

    def _fail_all(self, e: Exception) -> None:
        live, self._live = list(self._live.values()), {}
        try:
            self._llm.abort_request([r.id for r in live])
        except Exception:  # noqa: BLE001 - the engine is already failing
            log.exception("vllm abort after a failed step")
        for r in live:
            r.done = True
            r.sink.fail(e)

    def _close(self, broken: EngineBroken | None = None) -> None:
        err = broken or RuntimeError("the engine stopped")
        with self._cond:
            waiting, self._waiting = [w[2] for w in self._waiting], []
        self._fail_all(err)
        for r in waiting:
            r.sink.fail(err)
        self._shut_down()

    def _shut_down(self) -> None:
        """vLLM's engine core process is stopped now rather than whenever the garbage
        collector gets to its client (its memory freed with it)."""
        self._closing.set()
        llm, self._llm = self._llm, None
        if llm is None:
            return
        try:
            llm.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - stopping goes on; the state is rebuilt at need
            log.exception("vLLM engine of %s: shutting down its core failed",
                          self.model.model_id)
        del llm
        gc.collect()
