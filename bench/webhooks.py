"""Webhook deliveries: latency from the status change to receipt, and deliveries/s one
control worker sustains.

A stack runs on one data dir (embedded PostgreSQL and Redis) with its control worker
only. Events are written to the outbox the way a status change writes them
(``jobs.webhooks.events.emit`` in a transaction of their own), for one project whose endpoint
is a receiver on 127.0.0.1 in this process (http.server, threaded, answers 200). The
latency of a delivery is its receipt time minus its event's ``created_at`` (the time
the outbox row was written, in the status change's transaction).

Each round:
- trickle: --trickle events, one every --gap seconds (status changes arriving one by
  one): latency p50/p99;
- burst: --burst events written at once (in transactions of 100): deliveries/s from
  the first write to the last receipt, and the latency under that load.
Signatures of a sample of the received deliveries are verified with the ``openai``
SDK's ``client.webhooks.unwrap``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.common import free_port, report, spread


class Receiver:
    """Records (webhook-id, receipt time, body, headers) of every request; answers 200,
    or after ``hang_s`` (longer than the senders' read timeout: they give up first)."""

    def __init__(self, hang_s: float = 0.0) -> None:
        self.got: dict[str, tuple[float, bytes, dict[str, str]]] = {}
        self.lock = threading.Lock()
        rx = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                t = time.time()
                with rx.lock:
                    rx.got.setdefault(self.headers["webhook-id"],
                                      (t, body, {k.lower(): v for k, v in self.headers.items()}))
                try:
                    time.sleep(hang_s)
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up waiting

            def log_message(self, *_: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256  # the listen backlog: a burst's connections wait here

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, ids: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if ids <= self.got.keys():
                    return
            time.sleep(0.01)
        raise TimeoutError(f"{len(ids - self.got.keys())} deliveries missing after {timeout}s")


def emit(ctx: Any, tenant_id: str, n: int) -> list[str]:
    from jobs.webhooks import events as webhooks

    with ctx.db.session() as s:
        return [e for i in range(n) if (e := webhooks.emit(
            ctx, s, tenant_id, "batch.completed", f"batch_bench{i}")) is not None]


def burst(ctx: Any, rx: Receiver, tenant_id: str, n: int) -> tuple[float, list[float]]:
    """``n`` events at once: deliveries/s from the first write to the last receipt, and
    each delivery's latency."""
    t0 = time.time()
    events = []
    for start in range(0, n, 100):
        events += emit(ctx, tenant_id, min(100, n - start))
    created = deliveries_of(ctx, events)
    rx.wait(set(created), 600)
    last = max(rx.got[d][0] for d in created)
    return len(created) / (last - t0), [rx.got[d][0] - c for d, c in created.items()]


def deliveries_of(ctx: Any, event_ids: list[str]) -> dict[str, float]:
    """delivery id -> its event's created_at."""
    from sqlalchemy import select

    from jobs.core.webhook_tables import WebhookDelivery, WebhookEvent

    with ctx.db.session() as s:
        return dict(s.execute(select(WebhookDelivery.id, WebhookEvent.created_at).join(
            WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id).where(
            WebhookEvent.id.in_(event_ids))).all())


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def one_round(ctx: Any, rx: Receiver, tenant_id: str, args: argparse.Namespace,
              slow: Receiver | None = None, slow_tenant: str = "") -> dict[str, Any]:
    events: list[str] = []
    for _ in range(args.trickle):
        events += emit(ctx, tenant_id, 1)
        time.sleep(args.gap)
    created = deliveries_of(ctx, events)
    rx.wait(set(created), 120)
    trickle = [rx.got[d][0] - c for d, c in created.items()]

    rate, lat = burst(ctx, rx, tenant_id, args.burst)
    out = {"trickle_p50_ms": 1000 * statistics.median(trickle),
           "trickle_p99_ms": 1000 * pct(trickle, 0.99),
           "burst_p50_ms": 1000 * statistics.median(lat),
           "burst_p99_ms": 1000 * pct(lat, 0.99), "burst_deliveries_per_s": rate}
    if slow is not None:  # the same burst while another project's receiver hangs
        from jobs.webhooks import endpoints

        hook = endpoints.create_endpoint(ctx, slow_tenant, endpoints.EndpointCreate(
            name="hangs", url=slow.url, event_types=["batch.completed"]))
        emit(ctx, slow_tenant, args.slow_backlog)
        while len(slow.got) < ctx.settings.webhook_concurrency_per_target:
            time.sleep(0.01)  # its sends have taken their slots
        rate, lat = burst(ctx, rx, tenant_id, args.burst)
        endpoints.delete_endpoint(ctx, slow_tenant, hook.id)  # and its backlog with it
        slow.got.clear()
        out.update({"hung_p50_ms": 1000 * statistics.median(lat),
                    "hung_p99_ms": 1000 * pct(lat, 0.99), "hung_deliveries_per_s": rate,
                    "hung_retained": rate / out["burst_deliveries_per_s"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trickle", type=int, default=200)
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between trickle events")
    ap.add_argument("--burst", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--poll", type=float, default=0.2, help="INFERQ_WEBHOOK_POLL_INTERVAL_S")
    ap.add_argument("--slow-backlog", type=int, default=500,
                    help="events of the project whose receiver hangs")
    ap.add_argument("--read-timeout", type=float, default=2.0,
                    help="INFERQ_WEBHOOK_READ_TIMEOUT_S (the hanging receiver sleeps 2x)")
    args = ap.parse_args()

    from openai import OpenAI

    from cli.stack import Stack
    from jobs.core.context import Context
    from jobs.core.settings import Settings
    from jobs.tenants import auth
    from jobs.webhooks import endpoints

    rx, slow = Receiver(), Receiver(hang_s=2 * args.read_timeout)
    with tempfile.TemporaryDirectory() as tmp:
        st = Settings(data_dir=Path(tmp), api_port=free_port(), chat_model="",
                      webhook_concurrency=args.concurrency, webhook_poll_interval_s=args.poll,
                      webhook_read_timeout_s=args.read_timeout, webhook_allow_hosts="127.0.0.1")
        stack = Stack(st, model_workers=0)
        try:
            stack.start(api=False, workers=True)
            ctx = Context(stack.settings)
            tenant_id, _ = auth.create_tenant(ctx, "bench-webhooks")
            slow_tenant, _ = auth.create_tenant(ctx, "bench-webhooks-hangs")
            endpoint = endpoints.create_endpoint(ctx, tenant_id, endpoints.EndpointCreate(
                name="bench", url=rx.url, event_types=["batch.completed"]))
            one_round(ctx, rx, tenant_id, argparse.Namespace(trickle=20, gap=0.02, burst=100))
            results = []
            for i in range(args.rounds):
                r = one_round(ctx, rx, tenant_id, args, slow, slow_tenant)
                results.append(r)
                print(f"round {i + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()))
            sdk = OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
            sample = list(rx.got.values())[-50:]
            for _t, body, headers in sample:
                event = sdk.webhooks.unwrap(body, headers, secret=endpoint.secret)
                assert event.type == "batch.completed"
            ctx.close()
        finally:
            stack.stop()
            rx.server.shutdown()
            slow.server.shutdown()

    def col(key: str) -> str:
        return spread([r[key] for r in results])

    per_target = stack.settings.webhook_concurrency_per_target
    rows = [
        [f"trickle ({args.trickle} events, one per {args.gap * 1000:g} ms)",
         col("trickle_p50_ms"), col("trickle_p99_ms"), "-", "-"],
        [f"burst ({args.burst} events at once)", col("burst_p50_ms"), col("burst_p99_ms"),
         col("burst_deliveries_per_s"), "1"],
        [f"the same burst while another receiver hangs ({args.slow_backlog} events due)",
         col("hung_p50_ms"), col("hung_p99_ms"), col("hung_deliveries_per_s"),
         col("hung_retained")],
    ]
    report("webhooks", f"webhook deliveries: one control worker, {args.concurrency} send "
           f"slots ({per_target} per target), poll every {args.poll:g} s, read timeout "
           f"{args.read_timeout:g} s, receivers on 127.0.0.1; median (min-max) of "
           f"{args.rounds} rounds; {len(sample)} signatures verified with the SDK",
           ["load", "latency p50 ms", "latency p99 ms", "deliveries/s",
            "deliveries/s ÷ burst alone"], rows,
           {"args": vars(args), "rounds": results, "verified": len(sample),
            "note": "latency: receipt time minus the outbox row's created_at"})


if __name__ == "__main__":
    main()
