// How numbers, durations and times read on the page.

const integer = new Intl.NumberFormat("en-US");

export const TERMINAL = new Set(["completed", "failed", "expired", "cancelled"]);
export const RANK = { validating: 0, in_progress: 1, cancelling: 2, finalizing: 3 };
export const rank = (status) => (TERMINAL.has(status) ? 4 : RANK[status] ?? 0);

export const count = (n) => (n == null ? "—" : integer.format(n));

export function done(counts) {
  return (counts.completed || 0) + (counts.failed || 0);
}

export function percent(part, total) {
  if (!total) return 0;
  return Math.min(100, Math.max(0, (100 * part) / total));
}

export function rate(perSecond) {
  if (perSecond == null) return "—";
  const digits = perSecond < 10 ? 1 : 0;
  return `${perSecond.toFixed(digits)}/s`;
}

export function duration(seconds) {
  if (seconds == null || !Number.isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  const h = Math.floor(s / 3600);
  return `${h} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

export function ago(unixSeconds, now = Date.now() / 1000) {
  if (unixSeconds == null) return "—";
  const s = Math.max(0, now - unixSeconds);
  if (s < 45) return "just now";
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(unixSeconds * 1000).toISOString().slice(0, 10);
}

export function latency(seconds) {
  if (seconds == null) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
}

export function clock(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleTimeString("en-GB", { hour12: false });
}

export const label = (status) => String(status).replace("_", " ");
