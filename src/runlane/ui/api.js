// The dashboard's only way to the server: the public /v1 API with a bearer
// key kept in this tab's session storage, and SSE streams read with fetch()
// (EventSource cannot send an Authorization header).

const KEY_STORAGE = "runlane.apiKey";

export function getKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

export function setKey(key) {
  sessionStorage.setItem(KEY_STORAGE, key.trim());
}

export function clearKey() {
  sessionStorage.removeItem(KEY_STORAGE);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders() {
  const key = getKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function errorOf(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || code;
  try {
    const body = await response.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
    } else if (body && body.detail) {
      message = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    }
  } catch {
    // not JSON: keep the status text
  }
  return new ApiError(response.status, code, message);
}

// Calls the API; resolves to the JSON body, rejects with an ApiError.
export async function api(method, path, body) {
  const headers = { Accept: "application/json", ...authHeaders() };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    throw await errorOf(response);
  }
  if (response.status === 204) {
    return null;
  }
  return response.json();
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === "") continue;
    for (const item of Array.isArray(value) ? value : [value]) {
      search.append(name, String(item));
    }
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Splits an SSE byte stream (already decoded) into events, per the
// EventSource processing model: "event", "data" (joined by newlines), "id";
// lines starting with ":" are comments (keep-alives).
export class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.event = "";
    this.data = [];
    this.id = null;
  }

  push(text) {
    this.buffer += text;
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (!match) break;
      // A lone "\r" at the very end may be the first half of "\r\n".
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      this.line(line);
    }
  }

  line(line) {
    if (line === "") {
      if (this.data.length || this.event) {
        this.onEvent({
          event: this.event || "message",
          data: this.data.join("\n"),
          id: this.id,
        });
      }
      this.reset();
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id") this.id = value;
  }
}

// Follows an SSE endpoint. ``onEvent({event, data, id})`` gets each event
// with ``data`` parsed as JSON; ``isFinal(event)`` says which event ends the
// stream. A dropped connection is reopened (with backoff) sending
// ``Last-Event-ID`` so that the server replays only what was missed; a 4xx
// answer ends the stream with ``onError``. ``close()`` stops it.
export function followStream(path, { onEvent, isFinal, onError, onOpen, lastEventId = null }) {
  const controller = new AbortController();
  const stream = { closed: false, lastEventId, finished: false };
  stream.close = () => {
    stream.closed = true;
    controller.abort();
  };
  stream.done = (async () => {
    let delay = 300;
    while (!stream.closed) {
      try {
        const headers = { Accept: "text/event-stream", ...authHeaders() };
        if (stream.lastEventId !== null && stream.lastEventId !== undefined) {
          headers["Last-Event-ID"] = String(stream.lastEventId);
        }
        const response = await fetch(path, {
          headers,
          cache: "no-store",
          signal: controller.signal,
        });
        if (!response.ok) {
          const error = await errorOf(response);
          if (response.status >= 400 && response.status < 500) {
            stream.closed = true;
            if (onError) onError(error);
            return;
          }
          throw error;
        }
        if (onOpen) onOpen();
        delay = 300;
        let final = false;
        const parser = new SseParser((raw) => {
          if (final || stream.closed) return;
          if (raw.id !== null) stream.lastEventId = raw.id;
          let data = raw.data;
          try {
            data = JSON.parse(raw.data);
          } catch {
            // keep the text
          }
          const event = { event: raw.event, data, id: raw.id };
          if (isFinal && isFinal(event)) final = true;
          onEvent(event);
        });
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parser.push(value);
          if (final || stream.closed) {
            await reader.cancel().catch(() => {});
            break;
          }
        }
        if (final) {
          stream.finished = true;
          stream.closed = true;
          return;
        }
      } catch (error) {
        if (stream.closed) return;
        if (error && error.name === "AbortError") return;
      }
      // The connection dropped before the final event: reconnect.
      await sleep(delay);
      delay = Math.min(delay * 2, 5000);
    }
  })();
  return stream;
}

// -- small DOM helpers shared by both pages --------------------------------

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "";
}

export function formatTime(value) {
  if (!value) return "";
  const date = new Date(value);
  return date.toLocaleTimeString([], { hour12: false });
}

export function ago(value, now = Date.now()) {
  if (!value) return "";
  const seconds = Math.max(0, (now - new Date(value).getTime()) / 1000);
  if (seconds < 60) return `${Math.round(seconds)}s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)}h`;
  return `${Math.round(seconds / 86400)}d`;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)}s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m`;
  return `${(seconds / 3600).toFixed(1)}h`;
}

export const TERMINAL = new Set(["completed", "failed", "dead", "cancelled", "interrupted"]);

// The key form shown until a key is pasted. ``onReady`` runs once a key is
// kept (at once when this tab already has one).
export function setupKeyGate({ gate, form, input, status, onReady }) {
  const show = () => {
    const has = Boolean(getKey());
    gate.hidden = has;
    document.body.classList.toggle("needs-key", !has);
    if (status) status.textContent = has ? "key set" : "no key";
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!input.value.trim()) return;
    setKey(input.value);
    input.value = "";
    show();
    onReady();
  });
  show();
  if (getKey()) onReady();
  return {
    forget() {
      clearKey();
      show();
    },
    show,
  };
}
