// p50/p99 latency per lane over the window (uPlot, loaded as a classic script before us).

import { empty, replace } from "./dom.js";
import { latency } from "./format.js";

const COLORS = { realtime: "#2f5bea", jobs: "#0f9d8a", batch: "#d9822b", flex: "#9b51e0",
  control: "#6b7280" };
const HEIGHT = 220;

// The series of one metric as uPlot's aligned columns: x (unix seconds), then p50 and p99
// per lane, null where a lane had no observations in that minute.
export function columns(series, metric) {
  const lanes = series.filter((s) => s.metric === metric && s.points.length);
  const xs = [...new Set(lanes.flatMap((s) => s.points.map((p) => p.t)))].sort((a, b) => a - b);
  const data = [xs];
  for (const s of lanes) {
    const at = new Map(s.points.map((p) => [p.t, p]));
    data.push(xs.map((t) => at.get(t)?.p50 ?? null), xs.map((t) => at.get(t)?.p99 ?? null));
  }
  return { lanes: lanes.map((s) => s.lane), data };
}

function logRange(u, min, max) {
  const lo = Math.max(0.001, min || 0.001);
  const hi = Math.max(lo * 10, max || 1);
  return [10 ** Math.floor(Math.log10(lo)), 10 ** Math.ceil(Math.log10(hi))];
}

// Points are drawn for a series with many empty minutes (lines alone would hide them).
function sparse(u, si) {
  const values = u.data[si];
  return values.filter((v) => v != null).length < 0.6 * values.length;
}

// Grid lines at the powers of ten only (1 ms, 10 ms, 100 ms, 1 s, ...).
function decades(u, axisIdx, min, max) {
  const out = [];
  for (let e = Math.round(Math.log10(min)); e <= Math.round(Math.log10(max)); e++) out.push(10 ** e);
  return out;
}

function options(lanes, width) {
  const series = [{}];
  for (const lane of lanes) {
    const stroke = COLORS[lane] || "#374151";
    // A minute without requests is a gap; a lone minute shows as its point.
    const points = { show: sparse, size: 4, fill: stroke };
    series.push({ label: `${lane} p50`, stroke, width: 2, points, value: (u, v) => latency(v) },
      { label: `${lane} p99`, stroke, width: 1.5, dash: [6, 4], points, value: (u, v) => latency(v) });
  }
  const axis = { stroke: "#6b7280", grid: { stroke: "#eceff3" }, ticks: { stroke: "#eceff3" } };
  return {
    width, height: HEIGHT, series, legend: { live: true },
    // Logarithmic: a lane's milliseconds and another's seconds both stay readable.
    scales: { x: { time: true }, y: { distr: 3, log: 10, range: logRange } },
    axes: [axis, { ...axis, size: 64, splits: decades, values: (u, ticks) => ticks.map(latency) }],
  };
}

// One chart on the page, kept between refreshes: new data is set on it, and it is made
// again only when the lanes shown change.
export class LatencyChart {
  constructor(figure) {
    this.figure = figure;
    this.metric = figure.dataset.metric;
    this.plot = figure.querySelector(".plot");
    this.chart = null;
    this.lanes = "";
    new ResizeObserver(() => this.resize()).observe(this.plot);
  }

  width() {
    return Math.max(240, this.plot.clientWidth);
  }

  resize() {
    if (this.chart && Math.abs(this.chart.width - this.width()) > 1) {
      this.chart.setSize({ width: this.width(), height: HEIGHT });
    }
  }

  update(latencySeries) {
    const { lanes, data } = columns(latencySeries, this.metric);
    if (!lanes.length) {
      this.clear();
      replace(this.plot, empty("No requests in the last hour",
        "Each minute with requests on a lane adds a point."));
      return;
    }
    if (this.chart && this.lanes === lanes.join()) {
      this.chart.setData(data);
      return;
    }
    this.clear();
    this.plot.replaceChildren();
    this.lanes = lanes.join();
    this.chart = new globalThis.uPlot(options(lanes, this.width()), data, this.plot);
  }

  clear() {
    if (this.chart) this.chart.destroy();
    this.chart = null;
    this.lanes = "";
  }
}
