// The dashboard's views: batches, a batch's shards, lanes and workers.

import { empty, h, keyedRows, replace, table } from "./dom.js";
import * as fmt from "./format.js";

const LANES = ["realtime", "jobs", "batch", "flex", "control"];

export function progressBar(counts) {
  const total = counts.total || 0;
  const ok = h("span", { class: "ok" });
  const bad = h("span", { class: "bad" });
  ok.style.width = `${fmt.percent(counts.completed || 0, total)}%`;
  bad.style.width = `${fmt.percent(counts.failed || 0, total)}%`;
  return h("div", {
    class: "progress", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": total,
    "aria-valuenow": fmt.done(counts),
  }, ok, bad);
}

function progressText(counts) {
  const total = counts.total || 0;
  if (!total && !fmt.done(counts)) return [h("span", { class: "done muted" }, "counted once validated")];
  const pct = total ? ` · ${Math.floor(fmt.percent(fmt.done(counts), total))}%` : "";
  const failed = counts.failed ? h("span", { class: "failed" }, ` · ${fmt.count(counts.failed)} failed`) : null;
  return [h("span", { class: "done" }, `${fmt.count(fmt.done(counts))} / ${fmt.count(total)}`),
    pct, failed];
}

const status = (s, live = false) => h("span", { class: "status-cell" },
  h("span", { class: `badge status-${s}` }, fmt.label(s)),
  live ? h("span", { class: "live", title: "following the batch's event stream" }, "live") : null);

// The batches table; `view` is {scope, live: Set of ids followed live, selected, onSelect}.
export function renderBatches(container, batches, view) {
  if (!batches.length) {
    container.dataset.scope = "";
    replace(container, empty("No batches yet",
      "Upload a JSONL or Parquet file and create a batch (",
      h("code", {}, "inferq submit requests.jsonl"),
      ", or POST /v1/batches): it shows up here, with its progress, as it runs."));
    return;
  }
  const org = view.scope === "organization";
  if (container.dataset.scope !== view.scope) {
    const columns = [{ title: "Batch" }, org ? { title: "Project" } : null, { title: "Status" },
      { title: "Progress", class: "wide" }, { title: "Rate", class: "num" },
      { title: "ETA", class: "num" }, { title: "Created", class: "num" }].filter(Boolean);
    const t = table(columns, "batches clickable");
    container.dataset.scope = view.scope;
    replace(container, t.el);
  }
  keyedRows(container.querySelector("tbody"), batches, (b) => b.id, (b) => h("tr", {
    tabindex: 0, onclick: () => view.onSelect(b.id),
    onkeydown: (e) => { if (e.key === "Enter") view.onSelect(e.currentTarget.dataset.key); },
  }), (tr, b) => {
    const counts = b.request_counts;
    tr.dataset.id = b.id;
    tr.dataset.status = b.status;
    tr.dataset.done = fmt.done(counts);
    tr.dataset.total = counts.total;
    tr.classList.toggle("selected", b.id === view.selected);
    const what = [b.endpoint, b.model].filter(Boolean).join(" · ");
    replace(tr,
      h("td", {}, h("div", { class: "mono" }, b.id), h("div", { class: "muted small" }, what)),
      org ? h("td", { class: "mono small" }, b.project_id) : null,
      h("td", {}, status(b.status, view.live.has(b.id))),
      h("td", { class: "wide" }, progressBar(counts), h("div", { class: "small" }, progressText(counts))),
      h("td", { class: "num" }, fmt.TERMINAL.has(b.status) ? "—" : fmt.rate(b.rate_per_s)),
      h("td", { class: "num" }, fmt.TERMINAL.has(b.status) ? "—" : fmt.duration(b.eta_s)),
      h("td", { class: "num muted", title: new Date(b.created_at * 1000).toISOString() },
        fmt.ago(b.created_at)));
  });
}

export function renderDetail(container, detail) {
  const b = detail.batch;
  const counts = b.request_counts;
  const facts = [["Status", status(b.status)], ["Project", h("span", { class: "mono" }, b.project_id)],
    ["Endpoint", b.endpoint], ["Model", b.model || "—"], ["Requests", progressText(counts)],
    ["Rate", fmt.rate(b.rate_per_s)], ["ETA", fmt.duration(b.eta_s)],
    ["Created", new Date(b.created_at * 1000).toLocaleString("en-GB")]];
  const shards = detail.shards || [];
  let body;
  if (!shards.length) {
    body = empty("No shards yet", "A batch is cut into shards once its input is validated.");
  } else {
    const t = table([{ title: "Shard", class: "num" }, { title: "Status" },
      { title: "Rows", class: "num" }, { title: "Done", class: "wide" }, { title: "Worker" },
      { title: "Attempts", class: "num" }], "shards");
    for (const s of shards) {
      const bar = progressBar({ total: s.rows, completed: s.done, failed: 0 });
      t.tbody.append(h("tr", { dataset: { index: s.index, status: s.status } },
        h("td", { class: "num" }, s.index), h("td", {}, status(s.status)),
        h("td", { class: "num" }, fmt.count(s.rows)),
        h("td", { class: "wide" }, bar, h("div", { class: "small" }, `${fmt.count(s.done)} / ${fmt.count(s.rows)}`)),
        h("td", { class: "mono small" }, s.worker || "—"), h("td", { class: "num" }, s.attempts)));
    }
    body = t.el;
  }
  replace(container,
    h("p", { class: "mono detail-id" }, b.id),
    h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v)))),
    h("h3", {}, `Shards (${shards.length})`), body);
}

export function renderLanes(container, lanes) {
  if (!lanes.length) {
    replace(container, empty("No lanes to show", "Queue depths appear once the API can read Redis."));
    return;
  }
  const order = (l) => (LANES.indexOf(l.lane) + 1 || 99);
  const sorted = [...lanes].sort((a, b) => order(a) - order(b) || String(a.model).localeCompare(String(b.model)));
  const deepest = Math.max(1, ...sorted.map((l) => l.queue_depth));
  const t = table([{ title: "Lane" }, { title: "Model" }, { title: "Queued", class: "num" },
    { title: "", class: "wide" }], "lanes");
  for (const l of sorted) {
    const fill = h("span", { class: `lane-${l.lane}` });
    fill.style.width = `${fmt.percent(l.queue_depth, deepest)}%`;
    t.tbody.append(h("tr", { dataset: { lane: l.lane } },
      h("td", {}, h("span", { class: `chip lane-${l.lane}` }, l.lane)),
      h("td", { class: "small nowrap", title: l.model || "" }, l.model || "—"),
      h("td", { class: "num" }, fmt.count(l.queue_depth)),
      h("td", { class: "wide" }, h("div", { class: "depth" }, fill))));
  }
  replace(container, t.el);
}

export function renderWorkers(container, workers) {
  if (!workers.length) {
    replace(container, empty("No workers are running",
      "Start one with ", h("code", {}, "inferq worker --lanes realtime,jobs,batch"),
      "; it appears here at its first heartbeat."));
    return;
  }
  const t = table([{ title: "Worker" }, { title: "Lanes" }, { title: "Models" },
    { title: "Breaker" }, { title: "Seen", class: "num" }], "workers");
  for (const w of workers) {
    t.tbody.append(h("tr", { dataset: { worker: w.name } },
      h("td", { class: "mono small" }, w.name),
      h("td", {}, w.lanes.map((l) => h("span", { class: `chip lane-${l}` }, l))),
      h("td", { class: "small" }, w.models.join(", ") || "—"),
      h("td", {}, h("span", { class: `badge breaker-${w.breaker}` }, fmt.label(w.breaker))),
      h("td", { class: "num muted" }, w.seen_s_ago < 1 ? "now" : `${Math.round(w.seen_s_ago)} s ago`)));
  }
  replace(container, t.el);
}
