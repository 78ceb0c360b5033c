// The dashboard: log in with a key, then keep the views current.
//
// The overview (GET /v1/dashboard/overview) is read every POLL_MS for the admin key;
// for a project key less often, and the running batches' progress follows their event
// streams (GET /v1/batches/<id>/events) instead. The key lives in sessionStorage.

import * as api from "./api.js";
import { LatencyChart } from "./charts.js";
import * as fmt from "./format.js";
import { renderBatches, renderDetail, renderLanes, renderWorkers } from "./views.js";

const KEY = "inferq.dashboard.key";
const POLL_MS = { organization: 2000, project: 10000 };
const DETAIL_MS = 2000;
// Each stream holds one of the browser's few connections to this origin: the rest of the
// running batches are updated by the overview.
const MAX_STREAMS = 3;

const $ = (id) => document.getElementById(id);
const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
});

// Follows one batch's event stream until its terminal status, reconnecting with the last
// event id when the server ends the stream or the connection drops.
class Follower {
  constructor(session, batchId) {
    this.session = session;
    this.batchId = batchId;
    this.abort = new AbortController();
    this.lastEventId = "";
    this.connected = false;
    this.run();
  }

  async run() {
    const { signal } = this.abort;
    let wait = 1000;
    while (!signal.aborted) {
      try {
        const r = await api.readEvents(this.session.key, this.batchId, this.lastEventId,
          (kind, data, id) => this.onEvent(data, id), signal);
        this.setConnected(false);
        if (r.finished || this.ended) break;
        wait = r.retry ?? 1000;
      } catch (e) {
        this.setConnected(false);
        if (signal.aborted) break;
        if (e.status === 401) return this.session.refused(e);
        if (e.status === 404 || e.status === 400) break; // gone, or not this key's
        wait = Math.min(30000, wait * 2);
      }
      await sleep(wait, signal);
    }
    this.setConnected(false);
    this.session.followerEnded(this);
  }

  onEvent(data, id) {
    this.lastEventId = id;
    this.ended = fmt.TERMINAL.has(data.status);
    this.setConnected(!this.ended);
    this.session.progress(data);
  }

  setConnected(on) {
    if (this.connected === on) return;
    this.connected = on;
    this.session.render();
  }

  stop() {
    this.abort.abort();
    clearTimeout(this.soon);
  }
}

class Session {
  constructor(key, first, charts) {
    this.key = key;
    this.abort = new AbortController();
    this.followers = new Map();
    this.soon = null;
    this.batches = [];
    this.selected = null;
    this.charts = charts;
    this.apply(first);
    this.poll();
  }

  get streaming() {
    return this.scope === "project";
  }

  async poll() {
    const { signal } = this.abort;
    while (!signal.aborted) {
      await sleep(POLL_MS[this.scope] ?? 2000, signal);
      if (signal.aborted || document.hidden) continue;
      try {
        this.apply(await api.overview(this.key, signal));
        showError($("dashboard-error"), null);
      } catch (e) {
        if (signal.aborted) return;
        if (e.status === 401) return this.refused(e);
        showError($("dashboard-error"), `${e.message} Showing the last data; retrying.`);
      }
    }
  }

  apply(ov) {
    this.scope = ov.scope;
    $("scope").textContent = ov.scope === "organization" ? "admin key · every project"
      : `project ${ov.project_id}`;
    $("updated").textContent = `updated ${fmt.clock(ov.generated_at)}`;
    const live = new Map(this.batches.map((b) => [b.id, b]));
    // Counts and statuses only grow: a stream's event may be newer than this overview.
    this.batches = ov.batches.map((b) => newer(live.get(b.id), b));
    renderLanes($("lanes"), ov.lanes);
    renderWorkers($("workers"), ov.workers);
    for (const c of this.charts) c.update(ov.latency.series);
    if (this.streaming) this.follow();
    this.render();
  }

  follow() {
    const running = this.batches.filter((b) => !fmt.TERMINAL.has(b.status)).slice(0, MAX_STREAMS);
    for (const b of running) {
      if (!this.followers.has(b.id)) this.followers.set(b.id, new Follower(this, b.id));
    }
  }

  followerEnded(f) {
    if (this.followers.get(f.batchId) === f) this.followers.delete(f.batchId);
    if (!this.abort.signal.aborted) this.render();
  }

  // A batch's event: its counts and status, with ETA from the overview's rate.
  progress(data) {
    const i = this.batches.findIndex((b) => b.id === data.batch_id);
    if (i < 0) return;
    const b = this.batches[i];
    this.batches[i] = newer(b, { ...b, status: data.status, request_counts: data.request_counts });
    // The rate is the overview's (done per second since in progress): one that had none
    // yet, or a batch that ended, is read again soon rather than at the next poll.
    if (!(b.rate_per_s > 0) || fmt.TERMINAL.has(data.status)) this.refreshSoon();
    this.render();
    if (this.selected === b.id) this.refreshDetail();
  }

  refreshSoon() {
    if (this.soon) return;
    this.soon = setTimeout(async () => {
      try {
        const ov = await api.overview(this.key, this.abort.signal);
        if (!this.abort.signal.aborted) this.apply(ov);
      } catch {
        // the regular poll reports errors
      } finally {
        this.soon = null;
      }
    }, DETAIL_MS);
  }

  render() {
    const live = new Set([...this.followers.values()].filter((f) => f.connected).map((f) => f.batchId));
    renderBatches($("batches"), this.batches, {
      scope: this.scope, live, selected: this.selected, onSelect: (id) => this.select(id),
    });
    $("batches-note").textContent = this.batches.length
      ? `${this.batches.length} shown, newest first · ${this.streaming ? "running batches live" : "refreshed every 2 s"}`
      : "";
  }

  select(id) {
    this.selected = id;
    this.detailAbort?.abort();
    this.detailAbort = new AbortController();
    $("detail").hidden = false;
    $("detail-title").textContent = "Batch";
    $("detail-body").replaceChildren();
    this.render();
    this.followDetail(id, this.detailAbort.signal);
    $("detail").scrollIntoView({ block: "nearest" });
  }

  closeDetail() {
    this.selected = null;
    this.detailAbort?.abort();
    $("detail").hidden = true;
    this.render();
  }

  async followDetail(id, signal) {
    while (!signal.aborted && this.selected === id) {
      const detail = await this.refreshDetail(signal);
      if (!detail || fmt.TERMINAL.has(detail.batch.status)) return;
      await sleep(DETAIL_MS, signal);
    }
  }

  async refreshDetail(signal = this.detailAbort?.signal) {
    const id = this.selected;
    try {
      const detail = await api.batchDetail(this.key, id, signal);
      if (this.selected !== id || signal?.aborted) return null;
      renderDetail($("detail-body"), detail);
      return detail;
    } catch (e) {
      if (signal?.aborted) return null;
      if (e.status === 401) return this.refused(e);
      $("detail-body").replaceChildren(errorLine(e.message));
      return null;
    }
  }

  refused(e) {
    logout(`The key was refused: ${e.message}`);
    return null;
  }

  stop() {
    this.abort.abort();
    clearTimeout(this.soon);
    this.detailAbort?.abort();
    for (const f of this.followers.values()) f.stop();
    this.followers.clear();
    for (const c of this.charts) c.clear();
  }
}

// The later of two states of a batch (counts and statuses only grow), with its ETA from
// the current counts.
function newer(old, next) {
  if (!old) return next;
  const ahead = fmt.rank(old.status) > fmt.rank(next.status)
    || fmt.done(old.request_counts) > fmt.done(next.request_counts);
  const b = ahead ? { ...next, status: old.status, request_counts: old.request_counts } : next;
  const rate = b.rate_per_s;
  const left = b.request_counts.total - fmt.done(b.request_counts);
  return { ...b, eta_s: rate > 0 ? left / rate : b.eta_s };
}

function errorLine(message) {
  const p = document.createElement("p");
  p.className = "error";
  p.textContent = message;
  return p;
}

function showError(el, message) {
  el.hidden = !message;
  el.textContent = message || "";
}

let session = null;
let charts = [];

function showLogin(message) {
  $("dashboard").hidden = true;
  $("session").hidden = true;
  $("login").hidden = false;
  showError($("login-error"), message);
  $("key").focus();
}

async function start(key) {
  const first = await api.overview(key);
  sessionStorage.setItem(KEY, key);
  $("login").hidden = true;
  $("session").hidden = false;
  $("dashboard").hidden = false;
  $("detail").hidden = true;
  showError($("dashboard-error"), null);
  session = new Session(key, first, charts);
}

function logout(message = null) {
  session?.stop();
  session = null;
  sessionStorage.removeItem(KEY);
  $("key").value = "";
  for (const id of ["batches", "lanes", "workers", "detail-body"]) $(id).replaceChildren();
  $("batches").dataset.scope = "";
  showLogin(message);
}

async function login(event) {
  event.preventDefault();
  const key = $("key").value.trim();
  if (!key) return showError($("login-error"), "Enter an API key.");
  const button = $("login-submit");
  button.disabled = true;
  showError($("login-error"), null);
  try {
    await start(key);
    $("key").value = "";
  } catch (e) {
    showError($("login-error"), e.message);
  } finally {
    button.disabled = false;
  }
}

function main() {
  charts = [...document.querySelectorAll(".chart")].map((f) => new LatencyChart(f));
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", () => logout());
  $("detail-close").addEventListener("click", () => session?.closeDetail());
  const key = sessionStorage.getItem(KEY);
  if (!key) return showLogin(null);
  start(key).catch((e) => {
    sessionStorage.removeItem(KEY);
    showLogin(e.status === 401 ? `The key was refused: ${e.message}` : e.message);
  });
}

main();
