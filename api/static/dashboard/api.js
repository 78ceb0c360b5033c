// The dashboard's requests to the API. The key goes in the Authorization header only.

export class ApiError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.name = "ApiError";
    this.status = status; // 0: no answer at all
    this.code = code;
  }
}

function headers(key, extra = {}) {
  return { Authorization: `Bearer ${key}`, ...extra };
}

async function send(path, init) {
  try {
    return await fetch(path, { cache: "no-store", credentials: "omit", ...init });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "The API did not answer.");
  }
}

async function errorOf(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) {
      return new ApiError(resp.status, body.error.message, body.error.code);
    }
  } catch {
    // not the API's JSON error: fall through to the status line
  }
  return new ApiError(resp.status, `The API answered ${resp.status} ${resp.statusText}`.trim());
}

export async function getJSON(key, path, signal) {
  const resp = await send(path, { headers: headers(key, { Accept: "application/json" }), signal });
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

export const overview = (key, signal) => getJSON(key, "/v1/dashboard/overview?window=3600", signal);

export const batchDetail = (key, id, signal) =>
  getJSON(key, `/v1/dashboard/batches/${encodeURIComponent(id)}`, signal);

// A text/event-stream parser (the WHATWG rules: fields per line, an event per blank line).
export class EventParser {
  constructor() {
    this.buffer = "";
    this.reset();
    this.lastEventId = "";
    this.retry = null;
  }

  reset() {
    this.event = "";
    this.data = [];
  }

  // Feeds decoded text; returns the events it completed: {id, event, data}.
  push(text) {
    this.buffer += text;
    const out = [];
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.buffer);
      // a lone "\r" at the end may be the first half of "\r\n": wait for more
      if (!m || (m[0] === "\r" && m.index === this.buffer.length - 1)) break;
      const line = this.buffer.slice(0, m.index);
      this.buffer = this.buffer.slice(m.index + m[0].length);
      const ev = this.line(line);
      if (ev) out.push(ev);
    }
    return out;
  }

  line(line) {
    if (line === "") {
      if (this.data.length === 0) {
        this.reset();
        return null;
      }
      const ev = { id: this.lastEventId, event: this.event || "message", data: this.data.join("\n") };
      this.reset();
      return ev;
    }
    if (line.startsWith(":")) return null; // a comment (keep-alive)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id" && !value.includes("\0")) this.lastEventId = value;
    else if (field === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
    return null;
  }
}

// Reads one connection of GET /v1/batches/<id>/events, calling onEvent(data, id) for each
// event. Resolves when the server ends the stream: {lastEventId, retry, finished}, where
// finished means there is nothing more to follow (204: the client has seen the end).
export async function readEvents(key, batchId, lastEventId, onEvent, signal) {
  const extra = { Accept: "text/event-stream" };
  if (lastEventId) extra["Last-Event-ID"] = lastEventId;
  const path = `/v1/batches/${encodeURIComponent(batchId)}/events`;
  const resp = await send(path, { headers: headers(key, extra), signal });
  if (resp.status === 204) return { lastEventId, retry: null, finished: true };
  if (!resp.ok) throw await errorOf(resp);
  const parser = new EventParser();
  parser.lastEventId = lastEventId || "";
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    for (const ev of parser.push(value)) onEvent(ev.event, JSON.parse(ev.data), ev.id);
  }
  return { lastEventId: parser.lastEventId, retry: parser.retry, finished: false };
}
