"""Generation throughput, in one run: inferq's engine against the ways a user would
otherwise generate, on three workloads, greedy, SmolLM2-135M-Instruct.

Workloads (seed 0, built from bench.workload topics):
- ``uniform``: 1-4 sentence chat prompts, 32 new tokens each (the earlier benchmark);
- ``mixed``: 1-12 sentence prompts, max_tokens drawn from 8/16/32/64/128, stop at EOS;
- ``shared``: every row has the same ~300-token system prompt, a one-sentence
  question, max_tokens drawn from 16/32/64;
- ``json``: the ``mixed`` rows, each answer constrained to a JSON schema (an enum, a
  number, a string and a nested object: structured outputs), judged by its tokens/s
  against ``mixed``'s on the same side in the same run (constrained ÷ free).

Sides:
- ``engine``: inferq's engine as workers run it (prefix cache; no realtime rows here,
  so its batch prefill budget, 4096 tokens per step);
- ``vllm engine``: inferq's vLLM engine as workers run it (``workers.engines.vllm``:
  batch work in at most 32 of its 64 rows, prefix caching), fp32 weights;
- ``vLLM LLM.generate``: vLLM's own offline entry point on the same weights, engine
  settings and 32 sequences at once (the engine's limit: inferq's engine adds only its
  scheduling thread and the sinks);
- ``engine, no prefix reuse``: the same without the prefix cache;
- ``engine before``: the engine as it was before prefix reuse, prefill budgets and
  cache rows refilled in place: no prefix cache, 4096 prompt tokens per step, and the
  batch's cache copied whenever a sequence finishes (``EngineBefore``);
- ``generate, static batches``: transformers ``generate`` in batches of --batch in arrival
  order, each batch running to its longest row's max_tokens;
- ``generate, static batches sorted``: the same with rows sorted by prompt length;
- ``generate, one at a time``: batch size 1, on the first --solo rows;
- ``transformers continuous batching``: ``ContinuousBatchingManager``, each row with
  its own max_new_tokens.

Every side counts useful tokens only: each row's tokens up to its first EOS and at most
its own max_tokens. The engine's prefix cache is emptied before each of its runs, so a
round never reuses the previous round's prompts. Rounds alternate the sides.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bench import twins
from bench.common import report, spread
from bench.workload import TOPICS, sentence

QUESTIONS = ["Summarize this: {s}", "What happens next? {s}", "Rewrite politely: {s}",
             "Is this good news? {s}", "Explain to a child: {s}"]
BATCH = 32


def prompts(n: int, seed: int = 0, sentences: tuple[int, int] = (1, 4)
            ) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    names = sorted(TOPICS)
    out = []
    for _ in range(n):
        s = " ".join(sentence(rng, rng.choice(names)) for _ in range(rng.randint(*sentences)))
        out.append([{"role": "user", "content": rng.choice(QUESTIONS).format(s=s)}])
    return out


def system_prompt(tokens: Callable[[str], int], target: int = 300) -> str:
    """A fixed instruction of about ``target`` tokens."""
    rng = random.Random(42)
    names = sorted(TOPICS)
    text = ("You are a careful assistant for a data team. Follow these house rules "
            "and the examples of tone they give.")
    i = 1
    while tokens(text) < target:
        text += f" Rule {i}: {sentence(rng, rng.choice(names))}"
        i += 1
    return text


@dataclass
class Row:
    ids: list[int]
    max_tokens: int
    schema: dict[str, Any] | None = None  # structured outputs: the answer's JSON schema


SCHEMA = {"type": "object", "properties": {
    "label": {"type": "string", "enum": ["news", "opinion", "question", "other"]},
    "confidence": {"type": "number"}, "summary": {"type": "string"},
    "about": {"type": "object", "properties": {"topic": {"type": "string"}},
              "required": ["topic"], "additionalProperties": False}},
    "required": ["label", "confidence", "summary", "about"], "additionalProperties": False}


def workload(name: str, n: int, model: Any) -> list[Row]:
    rng = random.Random(7)
    if name == "uniform":
        return [Row(model.chat_ids(m), 32) for m in prompts(n)]
    if name in ("mixed", "json"):
        return [Row(model.chat_ids(m), rng.choice([8, 16, 32, 64, 128]),
                    SCHEMA if name == "json" else None)
                for m in prompts(n, seed=1, sentences=(1, 12))]
    system = system_prompt(lambda t: len(model.tokenizer(t)["input_ids"]))
    return [Row(model.chat_ids([{"role": "system", "content": system}, *m]),
                rng.choice([16, 32, 64])) for m in prompts(n, seed=2, sentences=(1, 1))]


def useful(row: list[int], limit: int, eos: set[int]) -> int:
    n = 0
    for t in row[:limit]:
        if t in eos:
            break
        n += 1
    return n


def run_engine(engine: Any, rows: list[Row]) -> tuple[float, int]:
    from jobs.protocol.structured import Constraint
    from workers.engines.request import GenRequest
    from workers.engines.sinks import Collect

    if getattr(engine, "cache", None) is not None:
        engine.cache.clear()
    elif hasattr(engine, "clear_cache"):
        engine.clear_cache()
    sinks = [Collect() for _ in rows]
    done = threading.Semaphore(0)
    for s in sinks:
        s.on_done = lambda _: done.release()
    t0 = time.perf_counter()
    for r, s in zip(rows, sinks, strict=True):
        engine.submit(GenRequest(prompt=r.ids, max_new_tokens=r.max_tokens, temperature=0,
                                 constraint=None if r.schema is None else
                                 Constraint(r.schema)), s, 2)
    for _ in sinks:
        done.acquire()
    dt = time.perf_counter() - t0
    return dt, sum(s.result().usage.completion_tokens for s in sinks)


@torch.inference_mode()
def run_generate(model: Any, rows: list[Row], batch: int, order: str = "arrival"
                 ) -> tuple[float, int]:
    if order == "sorted":
        rows = sorted(rows, key=lambda r: len(r.ids))
    eos = set(model.eos_ids)
    tokens = 0
    t0 = time.perf_counter()
    for i in range(0, len(rows), batch):
        group = rows[i: i + batch]
        width = max(len(r.ids) for r in group)
        ids = torch.full((len(group), width), model.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(group):
            ids[j, width - len(r.ids):] = torch.tensor(r.ids)
            mask[j, width - len(r.ids):] = 1
        out = model.model.generate(input_ids=ids.to(model.device),
                                   attention_mask=mask.to(model.device),
                                   max_new_tokens=max(r.max_tokens for r in group),
                                   do_sample=False, pad_token_id=model.pad_id)
        for r, row in zip(group, out[:, width:].tolist(), strict=True):
            tokens += useful(row, r.max_tokens, eos)
    return time.perf_counter() - t0, tokens


def hf_continuous_here() -> bool:
    """Whether this transformers has the continuous batching configuration used here
    (its arguments changed before 5.19)."""
    import inspect

    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        return False
    return "page_size" in inspect.signature(ContinuousBatchingConfig).parameters


@torch.inference_mode()
def run_hf_continuous(model: Any, rows: list[Row]) -> tuple[float, int]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    m = model.model
    eos = set(model.eos_ids)
    gen = GenerationConfig(max_new_tokens=max(r.max_tokens for r in rows), do_sample=False,
                           eos_token_id=sorted(eos), pad_token_id=model.pad_id)
    # Sized for this workload (its default sizes the paged cache from free memory,
    # gigabytes on a CPU, which takes longer to allocate than the run).
    need = sum(len(r.ids) + r.max_tokens for r in rows[:BATCH])
    cfg = ContinuousBatchingConfig(page_size=64, num_blocks=2 * need // 64 + 64,
                                   max_batch_tokens=2048, max_requests_per_batch=BATCH)
    t0 = time.perf_counter()
    manager = m.init_continuous_batching(generation_config=gen,
                                         continuous_batching_config=cfg)
    manager.start()
    try:
        ids = [manager.add_request(r.ids, request_id=f"r{i}", max_new_tokens=r.max_tokens)
               for i, r in enumerate(rows)]
        limit = {rid: r.max_tokens for rid, r in zip(ids, rows, strict=True)}
        tokens, finished = 0, 0
        while finished < len(rows):
            res = manager.get_result(timeout=120)
            if res is None:
                raise RuntimeError("transformers' continuous batching stopped answering")
            if res.is_finished():
                if res.error is not None:
                    raise RuntimeError(f"transformers' continuous batching: {res.error}")
                finished += 1
                tokens += useful(res.generated_tokens, limit[res.request_id], eos)
    finally:
        manager.stop(block=True)
    return time.perf_counter() - t0, tokens


def engine_before(model: Any) -> Any:
    """The engine with its cache handling as it was: finished rows are removed (the
    batch's cache copied) at once, and joining rows are appended (copied again)."""
    from workers.engines.generation.engine import GenerationEngine
    from workers.models.chat import KV

    class EngineBefore(GenerationEngine):
        def _join(self, prev: list[Any], joined: list[Any], new_kv: Any) -> None:
            self._kv = KV.concat(self._kv if prev else None, new_kv)
            self._running = prev + joined

        def _reap(self) -> None:
            keep = [i for i, s in enumerate(self._running) if not s.done]
            if len(keep) < len(self._running):
                self._running = [self._running[i] for i in keep]
                self._kv = self._kv.select(keep).trim() if keep and self._kv else None

    return EngineBefore(model, BATCH, BATCH, max_prefill_tokens=4096)


ENGINE, NO_REUSE, BEFORE = ("engine", "engine, no prefix reuse", "engine before")
VLLM, BARE = "vllm engine", "vLLM LLM.generate"
STATIC, SORTED, SOLO, HF = ("generate, static batches", "generate, static batches sorted",
                            "generate, one at a time", "transformers continuous batching")
SIDES = {"uniform": [ENGINE, VLLM, BARE, BEFORE, STATIC, SORTED],
         "mixed": [ENGINE, VLLM, BARE, BEFORE, STATIC, SORTED, SOLO, HF],
         "shared": [ENGINE, VLLM, BARE, NO_REUSE, BEFORE, SORTED, HF],
         "json": [ENGINE, VLLM, BARE]}
# The ratios each workload is judged by: (numerator, denominator).
RATIOS = {"uniform": [(VLLM, BARE), (VLLM, ENGINE), (ENGINE, STATIC), (ENGINE, BEFORE)],
          "mixed": [(VLLM, BARE), (VLLM, ENGINE), (ENGINE, SORTED), (ENGINE, STATIC),
                    (ENGINE, HF), (ENGINE, BEFORE)],
          "shared": [(VLLM, BARE), (VLLM, ENGINE), (ENGINE, NO_REUSE), (ENGINE, SORTED),
                     (ENGINE, HF), (ENGINE, BEFORE)],
          "json": [(VLLM, BARE), (VLLM, ENGINE)]}


class Bare:
    """vLLM's offline ``LLM.generate`` on the weights at ``path``, as ``VllmEngine`` is
    configured: fp32, eager, prefix caching, the same key/value cache, ``rows`` at once."""

    def __init__(self, path: Any, kv_bytes: int, rows: int) -> None:
        from workers.engines.vllm_setup import environment

        environment(torch.get_num_threads())
        from vllm import LLM
        from vllm.config import StructuredOutputsConfig

        set_threads = torch.set_num_threads  # (vLLM's CPU worker replaces it)
        self.llm = LLM(model=str(path), dtype="float32", enforce_eager=True,
                       max_num_seqs=rows, kv_cache_memory_bytes=kv_bytes,
                       enable_prefix_caching=True, disable_log_stats=True,
                       structured_outputs_config=StructuredOutputsConfig(backend="guidance"))
        torch.set_num_threads = set_threads

    def run(self, rows: list[Row]) -> tuple[float, int]:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        self.llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": r.ids} for r in rows], [SamplingParams(
            max_tokens=r.max_tokens, temperature=0, structured_outputs=None if r.schema is None
            else StructuredOutputsParams(json=r.schema)) for r in rows], use_tqdm=False)
        dt = time.perf_counter() - t0
        return dt, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--solo", type=int, default=16, help="rows run one at a time")
    ap.add_argument("--workloads", default="uniform,mixed,shared,json")
    ap.add_argument("--sides", default="", help="run only these sides (separated by ';', "
                    "or by ',' where no name has one)")
    ap.add_argument("--batch", type=int, default=32,
                    help="rows at once: the engines' batch rows and generate's batch size")
    args = ap.parse_args()
    global BATCH
    BATCH = args.batch
    only = set(args.sides.split(";" if ";" in args.sides else ",")) & {
        s for w in SIDES.values() for s in w}
    if not hf_continuous_here():
        print(f"{HF}: not in this transformers' form; left out")
        only = (only or {s for w in SIDES.values() for s in w}) - {HF}
    if args.sides and not only:
        ap.error("--sides names none of: "
                 + ", ".join(sorted({s for w in SIDES.values() for s in w})))
    if only:
        for w in SIDES:
            SIDES[w] = [s for s in SIDES[w] if s in only]
            RATIOS[w] = [(a, b) for a, b in RATIOS[w] if a in only and b in only]

    from jobs.core.settings import Settings
    from workers.engines.generation.engine import GenerationEngine
    from workers.engines.prefix_cache import WORTH_TOKENS, PrefixCache
    from workers.engines.vllm import VllmEngine
    from workers.models.chat import ChatModel, ChatTokens

    st = Settings.from_env()
    path = twins.chat_path()
    model = ChatModel("SmolLM2-135M-Instruct", path)
    kv = st.vllm_kv_cache_mb << 20
    make: dict[str, Callable[[], Any]] = {
        ENGINE: lambda: GenerationEngine(
            model, BATCH, BATCH, max_prefill_tokens=st.max_prefill_tokens,
            batch_prefill_tokens=st.batch_prefill_tokens,
            prefix_cache=PrefixCache(st.prefix_cache_mb << 20, min_hit_tokens=WORTH_TOKENS)),
        NO_REUSE: lambda: GenerationEngine(model, BATCH, BATCH,
                                           max_prefill_tokens=st.max_prefill_tokens,
                                           batch_prefill_tokens=st.batch_prefill_tokens),
        BEFORE: lambda: engine_before(model),
        VLLM: lambda: VllmEngine(ChatTokens(model.model_id, path), path, max_batch_rows=BATCH,
                                 max_rows=2 * BATCH, kv_cache_bytes=kv)}
    sides = {s for w in SIDES.values() for s in w}
    engines = {k: f() for k, f in make.items() if k in sides}
    bare = Bare(path, kv, BATCH) if BARE in sides else None
    names = [w for w in args.workloads.split(",") if w]
    loads = {w: workload(w, args.n, model) for w in names}
    warm = loads[names[0]][:4]
    for e in engines.values():  # warm-up
        run_engine(e, warm)
    run_generate(model, warm, 4)
    if bare is not None:
        bare.run(warm)

    def side(name: str, rows: list[Row]) -> tuple[float, int]:
        if name in engines:
            return run_engine(engines[name], rows)
        if name == BARE:
            assert bare is not None
            return bare.run(rows)
        if name == STATIC:
            return run_generate(model, rows, BATCH)
        if name == SORTED:
            return run_generate(model, rows, BATCH, "sorted")
        if name == SOLO:
            return run_generate(model, rows[: args.solo], 1)
        return run_hf_continuous(model, rows)

    res: dict[str, dict[str, list[tuple[float, int]]]] = {
        w: {s: [] for s in SIDES[w]} for w in names}
    for _ in range(args.rounds):
        for w in names:
            for s in SIDES[w]:
                res[w][s].append(side(s, loads[w]))
    for e in engines.values():
        e.stop()
    cached = {k: e.stats.snapshot() for k, e in engines.items()}
    rows_out, data = [], {}
    for w in names:
        rows = loads[w]
        tput = {s: [tok / dt for dt, tok in v] for s, v in res[w].items()}
        ratios = {f"{a} ÷ {b}": [x / y for x, y in zip(tput[a], tput[b], strict=True)]
                  for a, b in RATIOS[w]}
        if w == "json" and "mixed" in res:  # the constraint's cost: the same rows free
            free = {s: [tok / dt for dt, tok in v] for s, v in res["mixed"].items()}
            ratios.update({f"{s}: json ÷ mixed": [x / y for x, y in zip(
                tput[s], free[s], strict=True)] for s in SIDES[w] if s in free})
        desc = (f"{w}: {len(rows)} rows, prompts {min(len(r.ids) for r in rows)}–"
                f"{max(len(r.ids) for r in rows)} tokens, max_tokens "
                f"{min(r.max_tokens for r in rows)}–{max(r.max_tokens for r in rows)}")
        rows_out.append([desc, "", ""])
        for s in SIDES[w]:
            rows_out.append([f"  {s}" + (f" ({args.solo} rows)" if s == SOLO else ""),
                             spread(tput[s]), res[w][s][0][1]])
        for k, v in ratios.items():
            rows_out.append([f"  {k}", spread(v), ""])
        data[w] = {"seconds_tokens": res[w], "tokens_per_s": tput, "ratios": ratios,
                   "prompt_tokens": [len(r.ids) for r in rows],
                   "max_tokens": [r.max_tokens for r in rows]}
    report("generation", f"generation throughput, SmolLM2-135M-Instruct{twins.label()} "
           f"greedy, batch {BATCH}, {args.rounds} rounds; engine prefill budget "
           f"{st.batch_prefill_tokens} "
           f"(no realtime rows), prefix cache {st.prefix_cache_mb} MB",
           ["workload / side", "useful tokens/s (median [range])", "tokens"], rows_out,
           {"n": args.n, "rounds": args.rounds, "solo": args.solo, "batch": BATCH,
            "workloads": data, "engine_stats": cached})


if __name__ == "__main__":
    main()
