"""The web dashboard (/dashboard) in a real browser: Debian's chromium, driven by
Playwright, against the API served over HTTP on a database and Redis DB of this
module's own.

Batches are made and advanced by hand: the rows as validation writes them, the counts
through the workers' own fenced checkpoint (``jobs.batches.queries.checkpoint``), so the
page's numbers move as they do under real workers, with no model worker running. Every
test fails on any console message or page error it did not expect, and leaves a
screenshot in tests/artifacts/ (INFERQ_UPDATE_SCREENSHOT=1 also writes the README's
docs/img/dashboard.png)."""

from __future__ import annotations

import json
import math
import os
import random
import secrets
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect, sync_playwright
from werkzeug.serving import make_server

from jobs.batches import queries as repo
from jobs.batches.outputs import Tokens
from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.schema import Batch, File, Shard, new_id, now
from jobs.fleet import heartbeats
from jobs.slo import stats
from jobs.tenants import auth
from tests.conftest import RedisDatabases, fresh_database

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
README_IMAGE = ROOT / "docs" / "img" / "dashboard.png"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
MODEL = "all-MiniLM-L6-v2"
WAIT_MS = 20_000  # how long the page may take to show a change (a loaded machine)


@dataclass
class Site:
    """The API on a threaded HTTP server, its context, and the keys of two projects."""

    url: str
    ctx: Context
    admin_key: str
    projects: dict[str, tuple[str, str]] = field(default_factory=dict)  # name: (id, key)
    leases: dict[str, tuple[str, int]] = field(default_factory=dict)  # shard: (token, chunks)

    def project(self, name: str) -> tuple[str, str]:
        if name not in self.projects:
            self.projects[name] = auth.create_tenant(self.ctx, f"{name}-{secrets.token_hex(3)}")
        return self.projects[name]

    def batch(self, tenant_id: str, shard_rows: tuple[int, ...] = (200, 200),
              status: str = "in_progress", started_s_ago: int = 60) -> tuple[str, list[str]]:
        """A batch of ``len(shard_rows)`` shards (as validation leaves it, then moved to
        ``status``): (batch id, shard ids)."""
        with self.ctx.db.session() as s:
            f = File(id=new_id("file-"), tenant_id=tenant_id, filename="in.jsonl",
                     purpose="batch", format="jsonl", bytes=1, object_key="files/x")
            s.add(f)
            s.flush()
            t = now()
            b = Batch(id=new_id("batch_"), tenant_id=tenant_id, endpoint="/v1/embeddings",
                      input_file_id=f.id, completion_window="24h", status=status, model=MODEL,
                      defaults={}, created_at=t - started_s_ago - 5, expires_at=t + 86400,
                      total=sum(shard_rows),
                      in_progress_at=None if status == "validating" else t - started_s_ago)
            if status == "completed":
                b.finalizing_at = b.completed_at = t
            s.add(b)
            s.flush()
            ids = [f"{b.id}.{i:06d}" for i in range(len(shard_rows))]
            for i, rows in enumerate(shard_rows):
                done = status == "completed"
                s.add(Shard(id=ids[i], batch_id=b.id, index=i, rows=rows, object_key="shards/x",
                            dispatched_at=time.time(), status="done" if done else "queued",
                            completed=rows if done else 0, rows_done=rows if done else 0))
        return b.id, ids

    def advance(self, shard_id: str, completed: int, failed: int = 0,
                worker: str = "gpu0@test") -> None:
        """One chunk of ``completed + failed`` rows committed, as a worker's checkpoint
        does (the shard is claimed first, by ``worker``)."""
        with self.ctx.db.session() as s:
            if shard_id not in self.leases:
                token = secrets.token_hex(8)
                assert repo.claim_shard(s, shard_id, token, worker, 600) is not None
                self.leases[shard_id] = (token, 0)
            token, chunks = self.leases[shard_id]
            assert repo.checkpoint(s, shard_id, token, 1, chunks + 1, completed + failed,
                                   completed, failed, Tokens(prompt=9 * completed), 600)
        self.leases[shard_id] = (token, chunks + 1)


@pytest.fixture(scope="module")
def site(settings: Any, pg_admin_url: str, redis_dbs: RedisDatabases) -> Iterator[Site]:
    from api.app import create_app

    with fresh_database(pg_admin_url) as db_url, redis_dbs.lend() as redis_url:
        st = settings.model_copy(update={"database_url": db_url, "redis_url": redis_url,
                                         # a stream ends every 1.5 s: the page
                                         # resumes it with Last-Event-ID
                                         "events_poll_s": 0.1, "events_keepalive_s": 1.0,
                                         "events_max_s": 1.5})
        app = create_app(st)
        ctx: Context = app.extensions["inferq"]
        admin_key = f"iq-admin-{secrets.token_urlsafe(16)}"
        auth.ensure_admin_key(ctx, admin_key)
        srv = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=srv.serve_forever, daemon=True)
        thread.start()
        yield Site(f"http://127.0.0.1:{srv.server_port}", ctx, admin_key)
        srv.shutdown()
        time.sleep(st.events_max_s)  # the streams still open end before the database goes
        ctx.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@dataclass
class Tab:
    """A fresh browser context's page, and everything it said or loaded."""

    page: Any
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    streams: list[dict[str, str]] = field(default_factory=list)  # event streams' headers

    def login(self, site: Site, key: str) -> None:
        resp = self.page.goto(f"{site.url}/dashboard")
        assert resp is not None and resp.status == 200
        csp = resp.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        self.page.fill("#key", key)
        self.page.click("#login-submit")

    def row(self, batch_id: str) -> Any:
        return self.page.locator(f'#batches tr[data-id="{batch_id}"]')

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"dashboard-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def assert_quiet(self, site: Site, key: str | None = None) -> None:
        """No console message, no page error; nothing fetched from another origin; the
        key in no URL."""
        assert self.console == [] and self.errors == []
        assert self.urls and all(u.startswith(site.url + "/") for u in self.urls), self.urls
        if key:
            assert not any(key in u for u in self.urls)


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    t = Tab(page)
    page.on("console", lambda m: t.console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: t.errors.append(str(e)))
    page.on("request", lambda r: t.urls.append(r.url))
    page.on("request", lambda r: t.streams.append(r.headers) if r.url.endswith("/events")
            else None)
    yield t
    context.close()


def test_a_project_key_sees_its_batches_and_follows_a_running_one(site: Site, tab: Tab) -> None:
    tenant_id, key = site.project("search")
    running, shards = site.batch(tenant_id, (200, 200))
    finished, _ = site.batch(tenant_id, (50,), status="completed", started_s_ago=900)
    other, _ = site.batch(site.project("ranking")[0], (10,))
    tab.login(site, key)

    page = tab.page
    row = tab.row(running)
    expect(row).to_have_attribute("data-status", "in_progress")
    expect(row).to_have_attribute("data-done", "0")
    expect(row.locator(".live")).to_be_visible()  # followed over its event stream
    expect(tab.row(finished)).to_have_attribute("data-done", "50")
    expect(tab.row(finished).locator(".badge")).to_have_text("completed")
    assert tab.row(other).count() == 0  # another project's batch is not shown
    expect(page.locator("#scope")).to_have_text(f"project {tenant_id}")
    assert page.evaluate("sessionStorage.getItem('inferq.dashboard.key')") == key
    assert key not in page.url

    # The counts move as the workers' checkpoints commit chunks.
    site.advance(shards[0], 38, 2)
    expect(row).to_have_attribute("data-done", "40")
    expect(row.locator(".done")).to_have_text("40 / 400")
    expect(row.locator(".progress")).to_have_attribute("aria-valuenow", "40")
    site.advance(shards[0], 60)
    site.advance(shards[1], 100, worker="gpu1@test")
    expect(row).to_have_attribute("data-done", "200")
    expect(row.locator(".failed")).to_contain_text("2 failed")
    # The server ends each stream after events_max_s: the page resumes it where it was.
    with page.expect_request(lambda r: r.url.endswith("/events")
                             and r.headers.get("last-event-id") == "1-200"):
        pass
    site.advance(shards[1], 50)
    expect(row).to_have_attribute("data-done", "250")
    # every stream of the running batch (and only of it) was asked for with the key in its
    # header; the streams after the first resumed from the last event seen
    assert all(h["authorization"] == f"Bearer {key}" for h in tab.streams)
    resumed = [h["last-event-id"] for h in tab.streams if "last-event-id" in h]
    assert resumed and all(r.startswith("1-") for r in resumed), tab.streams
    assert {u for u in tab.urls if u.endswith("/events")} == {
        f"{site.url}/v1/batches/{running}/events"}

    # A batch's shards, on a click.
    row.click()
    detail = page.locator("#detail")
    expect(detail.locator(".detail-id")).to_have_text(running)
    shard_rows = detail.locator("table.shards tbody tr")
    expect(shard_rows).to_have_count(2)
    expect(shard_rows.nth(0)).to_contain_text("gpu0@test")
    expect(shard_rows.nth(1)).to_contain_text("gpu1@test")
    expect(shard_rows.nth(0).locator(".badge")).to_have_text("running")
    tab.shot("project")

    # The session survives a reload; logging out forgets the key.
    page.reload()
    expect(tab.row(running)).to_be_visible()
    page.click("#logout")
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#dashboard")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('inferq.dashboard.key')") is None
    tab.assert_quiet(site, key)


def test_the_admin_key_sees_every_project(site: Site, tab: Tab) -> None:
    search, _ = site.project("search")
    ranking, _ = site.project("ranking")
    a, a_shards = site.batch(search, (400, 400, 400), started_s_ago=120)
    b, b_shards = site.batch(ranking, (250, 250))
    c, _ = site.batch(ranking, (300,), status="completed", started_s_ago=1800)
    d, _ = site.batch(search, (), status="validating", started_s_ago=0)
    site.advance(a_shards[0], 400)
    site.advance(a_shards[1], 180, 3)
    site.advance(b_shards[0], 90)
    announce_workers(site)
    record_latencies(site)
    tab.login(site, site.admin_key)

    page = tab.page
    expect(page.locator("#scope")).to_contain_text("every project")
    for batch_id, project in ((a, search), (b, ranking), (c, ranking), (d, search)):
        expect(tab.row(batch_id)).to_contain_text(project)
    expect(tab.row(a)).to_have_attribute("data-done", "583")
    site.advance(b_shards[1], 120)  # the overview is polled: the next one shows it
    expect(tab.row(b)).to_have_attribute("data-done", "210")
    workers = page.locator("#workers tbody tr")
    expect(workers).to_have_count(2)
    expect(page.locator('#workers tr[data-worker="gpu1@test"] .badge')).to_have_text("half open")
    expect(page.locator('#lanes tr[data-lane="realtime"]')).to_contain_text("3")
    for chart in ("#chart-ttft", "#chart-queue"):  # p50 and p99 of each lane
        expect(page.locator(f"{chart} canvas")).to_have_count(1)
        expect(page.locator(f"{chart} .u-legend .u-series")).to_have_count(5)
    path = tab.shot("admin")
    if os.environ.get("INFERQ_UPDATE_SCREENSHOT") == "1":
        README_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, README_IMAGE)
    tab.assert_quiet(site, site.admin_key)


def test_the_lanes_card_holds_its_queue_bars_at_1400_px(site: Site, browser: Any) -> None:
    """Every lane's queue bar, its count and its model lie inside the Lanes card, at
    1,400 px wide, with a long model name and a deep queue."""
    long_model = "team-a-sentiment-extractor-SmolLM2-135M-Instruct-lora-v12"
    r = site.ctx.redis
    heartbeats.write(r, "gpu9@test", {"name": "gpu9@test", "lanes": ["realtime", "jobs"],
                                      "models": [long_model], "breaker": "closed",
                                      "metrics_url": None, "at": time.time()}, 600)
    r.rpush(redis_keys.realtime_queue(long_model), *([b"{}"] * 1234))
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        t = Tab(page)
        t.login(site, site.admin_key)
        bars = page.locator("#lanes .depth")
        expect(page.locator("#lanes tbody tr").first).to_be_visible()
        expect(page.locator("#lanes")).to_contain_text("1,234")
        expect(bars.first).to_be_visible()
        # One look at the page (the table is redrawn on every refresh): the card's box
        # and those of the bars and cells inside it.
        card, boxes = page.evaluate("""() => {
            const box = (e) => { const r = e.getBoundingClientRect();
                                 return {left: r.left, right: r.right}; };
            const lanes = document.getElementById("lanes");
            return [box(lanes.closest("section.card")),
                    [...lanes.querySelectorAll(".depth, td")].map(box)];
        }""")
        assert len(boxes) >= 5
        for b in boxes:
            assert card["left"] <= b["left"] and b["right"] <= card["right"] + 0.5, (b, card)
        t.shot("lanes-1400")
    finally:
        r.delete(redis_keys.realtime_queue(long_model))
        context.close()


def api_error(site: Site, path: str, key: str) -> dict[str, Any]:
    """The status and error message the API answers ``path`` with for ``key``."""
    req = urllib.request.Request(site.url + path, headers={"Authorization": f"Bearer {key}"})
    try:
        urllib.request.urlopen(req, timeout=30).close()
    except urllib.error.HTTPError as e:
        return {"status": e.code, "message": json.loads(e.read())["error"]["message"]}
    raise AssertionError(f"{path} accepted {key!r}")


def announce_workers(site: Site) -> None:
    """Two workers' heartbeats and a queued realtime request or three, written to this
    module's Redis DB as the workers and the API write them."""
    r = site.ctx.redis
    for name, lanes, breaker in (("gpu0@test", ["batch", "jobs", "realtime"], "closed"),
                                 ("gpu1@test", ["batch", "flex"], "half_open")):
        heartbeats.write(r, name, {"name": name, "lanes": lanes, "models": [MODEL],
                                     "breaker": breaker, "metrics_url": None,
                                     "at": time.time()}, 600)
    r.rpush(redis_keys.realtime_queue(MODEL), b"{}", b"{}", b"{}")


def record_latencies(site: Site) -> None:
    """An hour of time to first token and queue time on two lanes, observed and written
    as the workers' recorder does (a seeded random load, a busier half hour in it)."""
    rng = random.Random(7)
    t = [time.time() - 3600]
    rec = stats.Recorder(clock=lambda: t[0])
    rec.enabled = True
    for minute in range(60):
        t[0] = time.time() - 3600 + 60 * minute
        busy = 1.0 + 1.5 * math.exp(-((minute - 38) / 8) ** 2)
        for _ in range(40):
            rec.observe(stats.QUEUE, "realtime", MODEL, rng.lognormvariate(-5.0, 0.6) * busy)
            rec.observe(stats.TTFT, "realtime", MODEL, rng.lognormvariate(-3.3, 0.5) * busy)
        if minute % 3 == 0:
            for _ in range(10):
                rec.observe(stats.QUEUE, "jobs", MODEL, rng.lognormvariate(-2.0, 0.7) * busy)
                rec.observe(stats.TTFT, "jobs", MODEL, rng.lognormvariate(-1.6, 0.5) * busy)
        rec.write(site.ctx.redis)


def test_an_empty_project_and_a_wrong_key(site: Site, tab: Tab) -> None:
    page = tab.page
    tab.login(site, "iq-not-a-key")
    refused = api_error(site, "/v1/dashboard/overview", "iq-not-a-key")
    assert refused["status"] == 401 and refused["message"]
    expect(page.locator("#login-error")).to_have_text(refused["message"])
    expect(page.locator("#dashboard")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('inferq.dashboard.key')") is None
    # the browser's own line about the refused request is the only one
    assert [m for m in tab.console if "401" not in m] == []
    assert len(tab.console) == 1 and tab.console[0].startswith("error: Failed to load resource")
    tab.console.clear()

    _, key = auth.create_tenant(site.ctx, f"empty-{secrets.token_hex(3)}")
    page.fill("#key", key)
    page.click("#login-submit")
    expect(page.locator("#batches .empty-title")).to_have_text("No batches yet")
    expect(page.locator("#login-error")).to_be_hidden()
    tab.shot("empty")
    tab.assert_quiet(site, key)


def test_the_page_and_its_files_are_served_from_here_only(app: Any) -> None:
    """The page and every file it names come from /dashboard/static/ with the right types
    and the same-origin policy; a path outside the folder is a 404 in the error shape."""
    c = app.test_client()
    page = c.get("/dashboard")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    html = page.get_data(as_text=True)
    assert "http://" not in html and "https://" not in html
    for name in ("app.js", "vendor/uPlot.iife.min.js", "dashboard.css", "vendor/uPlot.min.css"):
        assert f'"/dashboard/static/{name}"' in html
    types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    for name in ("app.js", "api.js", "charts.js", "dom.js", "format.js", "views.js",
                 "dashboard.css", "icon.svg", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css"):
        resp = c.get(f"/dashboard/static/{name}")
        assert resp.status_code == 200, name
        assert resp.mimetype == types[Path(name).suffix], (name, resp.mimetype)
    for bad in ("../ui.py", "..%2Fui.py", "%2e%2e/__init__.py", "vendor/../../ui.py", "nope.js"):
        resp = c.get(f"/dashboard/static/{bad}")
        assert resp.status_code == 404, bad
        assert resp.get_json()["error"]["code"] == "not_found"
