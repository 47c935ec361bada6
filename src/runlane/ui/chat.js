// The chat page: one thread's lane for one agent. Everything shown comes
// from the server (runs of the thread, the lane snapshot, SSE streams), so a
// reload restores it; only the key (session storage) and the thread and
// agent (the URL hash) live in the browser.

import {
  ApiError,
  TERMINAL,
  api,
  el,
  followStream,
  formatTime,
  getKey,
  query,
  setupKeyGate,
} from "./api.js";

const $ = (id) => document.getElementById(id);

const REASONS = {
  lane_busy: "a reply is still running in this thread",
  queue_not_empty: "other inputs are waiting in the queue",
  lane_paused: "the thread is paused; continue it first",
  run_interrupted: "the agent is waiting for your answer to its question",
  steer_already_pending: "a steer is already waiting in this thread",
  steer_in_progress: "a steer is being applied right now",
  request_not_queued: "that input is no longer queued",
  request_already_dispatched: "that input has already started",
  queue_not_paused: "the thread is not paused",
  queue_empty: "nothing is waiting",
  run_active: "a reply is running",
  not_interrupted: "the run is not waiting for an answer",
  resume_superseded: "this question was already answered",
  run_finished: "the reply has already finished",
};

const PAUSE_REASONS = {
  run_cancelled: "the last reply was stopped",
  run_failed: "the last reply failed",
  run_dead: "the last reply failed after all its attempts",
};

const SYNC_MS = 3000;
const THREADS_MS = 10000;

const state = {
  thread: "",
  agent: "demo",
  generation: 0,
  runs: new Map(), // run_id -> entry
  lane: null,
  follower: null, // the head request's stream: {requestId, stream}
  syncing: false,
  syncAgain: false,
  loading: [], // terminal runs whose events are still to be read
  loadingActive: 0,
  bannerKey: null,
  queueKey: null,
  renderPending: false,
};

// -- the thread and agent, in the URL hash ----------------------------------

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  return { thread: params.get("thread") || "", agent: params.get("agent") || "" };
}

function writeHash(thread, agent, { replace = false } = {}) {
  const params = new URLSearchParams({ thread, agent });
  const url = `#${params.toString()}`;
  if (replace) history.replaceState(null, "", url);
  else location.hash = url;
}

function newThreadName() {
  const random = Math.random().toString(36).slice(2, 8);
  return `chat-${random}`;
}

function openFromHash() {
  let { thread, agent } = readHash();
  agent = agent || state.agent || "demo";
  if (!thread) {
    thread = newThreadName();
    writeHash(thread, agent, { replace: true });
  }
  if (thread === state.thread && agent === state.agent && state.lane) return;
  switchTo(thread, agent);
}

function switchTo(thread, agent) {
  state.generation += 1;
  for (const entry of state.runs.values()) {
    if (entry.stream) entry.stream.close();
  }
  closeFollower();
  state.thread = thread;
  state.agent = agent;
  state.runs = new Map();
  state.lane = null;
  state.loading = [];
  state.bannerKey = null;
  state.queueKey = null;
  $("conversation").replaceChildren();
  $("queue-list").replaceChildren();
  $("lane-banner").replaceChildren();
  $("notices").replaceChildren();
  $("thread-title").textContent = thread;
  $("agent-name").textContent = `agent ${agent}`;
  $("thread-input").value = thread;
  $("agent-input").value = agent;
  document.title = `runlane · ${thread}`;
  markCurrentThread();
  sync();
}

// -- reading the server -----------------------------------------------------

const threadPath = () => `/v1/threads/${encodeURIComponent(state.thread)}`;

async function sync() {
  if (!getKey() || !state.thread) return;
  if (state.syncing) {
    state.syncAgain = true;
    return;
  }
  state.syncing = true;
  try {
    do {
      state.syncAgain = false;
      const generation = state.generation;
      const [page, lane] = await Promise.all([
        api("GET", `/v1/runs${query({ thread_id: state.thread, agent: state.agent, limit: 200 })}`),
        api("GET", `${threadPath()}/queue${query({ agent: state.agent })}`),
      ]);
      if (generation !== state.generation) {
        state.syncAgain = true;
        continue;
      }
      const hadRuns = state.runs.size > 0;
      applyRuns(page.items);
      if (!hadRuns && state.runs.size > 0) loadThreads(); // a new thread has a first run
      applyLane(lane);
      render();
      if (lane.run_id && !state.runs.has(lane.run_id)) {
        // The lane moved on after the runs were listed: read again soon.
        setTimeout(sync, 250);
      }
    } while (state.syncAgain);
  } catch (error) {
    handleError(error);
  } finally {
    state.syncing = false;
  }
}

function handleError(error) {
  if (error instanceof ApiError && error.status === 401) {
    keyGate.forget();
    $("key-error").hidden = false;
    $("key-error").textContent = `The key was refused: ${error.message}`;
    return;
  }
  notice(`Error: ${error.message || error}`, "error");
}

function applyRuns(items) {
  for (const run of items) {
    let entry = state.runs.get(run.run_id);
    if (!entry) {
      entry = { run, text: "", lastSeq: 0, stream: null, loaded: false, ended: false };
      state.runs.set(run.run_id, entry);
    } else if (!entry.ended) {
      entry.run = { ...entry.run, ...run };
    } else {
      // The stream's end event already told the final state; keep the
      // listing's other fields fresh.
      entry.run = { ...run, ...pickEnd(entry.run) };
    }
    startEvents(entry);
  }
}

function pickEnd(run) {
  const { status, outcome, output, error, interrupt } = run;
  return { status, outcome, output, error, interrupt };
}

function applyLane(lane) {
  state.lane = lane;
  const head = lane.queued.length ? lane.queued[0] : null;
  if (!head) {
    closeFollower();
  } else if (!state.follower || state.follower.requestId !== head.request_id) {
    followHead(head.request_id);
  }
}

// -- streams ------------------------------------------------------------------

// A run's events: live runs are followed at once; finished ones are
// replayed (the stream replays and ends) two at a time, to stay within the
// browser's few connections per host.
function startEvents(entry) {
  if (entry.stream || entry.loaded) return;
  if (TERMINAL.has(entry.run.status)) {
    if (!entry.queuedForLoad) {
      entry.queuedForLoad = true;
      state.loading.push(entry);
      pumpLoading();
    }
    return;
  }
  openRunStream(entry);
}

function pumpLoading() {
  while (state.loadingActive < 2 && state.loading.length) {
    const entry = state.loading.shift();
    if (entry.stream || entry.loaded) continue;
    state.loadingActive += 1;
    const generation = state.generation;
    openRunStream(entry).done.finally(() => {
      if (generation !== state.generation) return;
      state.loadingActive -= 1;
      pumpLoading();
    });
  }
}

function openRunStream(entry) {
  const generation = state.generation;
  const id = entry.run.run_id;
  entry.stream = followStream(`/v1/runs/${id}/events`, {
    lastEventId: entry.lastSeq || null,
    isFinal: (event) => event.event === "end",
    onEvent: (event) => {
      if (generation !== state.generation) return;
      onRunEvent(entry, event);
    },
    onError: (error) => {
      entry.loaded = true;
      entry.stream = null;
      handleError(error);
    },
  });
  entry.stream.done.then(() => {
    if (generation !== state.generation) return;
    if (entry.stream && entry.stream.finished) entry.stream = null;
  });
  return entry.stream;
}

function onRunEvent(entry, event) {
  if (event.event === "end") {
    const wasLive = !TERMINAL.has(entry.run.status);
    entry.run = { ...entry.run, ...event.data };
    entry.ended = true;
    entry.loaded = true;
    scheduleRender();
    if (wasLive) sync(); // the lane may have moved on, paused or be waiting
    return;
  }
  const data = event.data || {};
  if (typeof data.seq === "number") {
    if (data.seq <= entry.lastSeq) return; // a replay we already have
    entry.lastSeq = data.seq;
  }
  if (data.kind === "token" && data.data && typeof data.data.text === "string") {
    entry.text += data.data.text;
  }
  if (entry.run.status === "pending") entry.run = { ...entry.run, status: "running" };
  scheduleRender();
}

function followHead(requestId) {
  closeFollower();
  const generation = state.generation;
  const follower = { requestId, stream: null };
  follower.stream = followStream(`/v1/requests/${encodeURIComponent(requestId)}/events`, {
    isFinal: (event) => event.event !== "queued",
    onEvent: (event) => {
      if (generation !== state.generation) return;
      if (event.event === "queued") {
        const item = state.lane && state.lane.queued.find((q) => q.request_id === requestId);
        if (item && item.position !== event.data.position) sync();
        return;
      }
      // dispatched (follow the run stream next), cancelled, rejected, failed
      if (state.follower === follower) state.follower = null;
      sync();
    },
    onError: () => {
      if (state.follower === follower) state.follower = null;
    },
  });
  state.follower = follower;
}

function closeFollower() {
  if (state.follower) {
    state.follower.stream.close();
    state.follower = null;
  }
}

// -- actions ------------------------------------------------------------------

async function send(text, policy) {
  let extra = {};
  const raw = $("input-extra").value.trim();
  if (raw) {
    try {
      extra = JSON.parse(raw);
    } catch {
      notice("Agent options must be a JSON object", "error");
      return false;
    }
    if (typeof extra !== "object" || Array.isArray(extra) || extra === null) {
      notice("Agent options must be a JSON object", "error");
      return false;
    }
  }
  const body = { agent: state.agent, input: { ...extra, text }, policy };
  try {
    const request = await api("POST", `${threadPath()}/requests`, body);
    if (request.status === "rejected") {
      notice(`Rejected “${text}”: ${explain(request.reason)}`, "rejected");
    } else if (request.status === "queued" && state.lane) {
      if (!state.lane.queued.some((q) => q.request_id === request.request_id)) {
        state.lane.queued = [...state.lane.queued, request].sort(
          (a, b) => (a.position || 0) - (b.position || 0),
        );
        renderQueue();
      }
    }
  } catch (error) {
    if (error instanceof ApiError && error.status === 409) {
      notice(`Not sent “${text}”: ${explain(error.code)}`, "rejected");
    } else {
      handleError(error);
    }
    return false;
  } finally {
    sync();
  }
  return true;
}

function explain(code) {
  return REASONS[code] ? `${REASONS[code]} (${code})` : code || "no reason given";
}

async function act(call) {
  try {
    await call();
  } catch (error) {
    if (error instanceof ApiError && error.status === 409) {
      notice(`Refused: ${explain(error.code)}`, "rejected");
    } else {
      handleError(error);
    }
  } finally {
    sync();
  }
}

const cancelRequest = (id) =>
  act(() => api("POST", `/v1/requests/${encodeURIComponent(id)}/cancel`));
const steerRequest = (id) =>
  act(() => api("POST", `/v1/requests/${encodeURIComponent(id)}/steer`));
const stopRun = (id) => act(() => api("POST", `/v1/runs/${id}/cancel`));
const continueLane = () =>
  act(() => api("POST", `${threadPath()}/queue/continue${query({ agent: state.agent })}`));
const resumeRun = (id, value) => act(() => api("POST", `/v1/runs/${id}/resume`, { value }));

function notice(text, kind = "info") {
  const box = $("notices");
  const item = el(
    "div",
    { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status" },
    el("span", { text }),
    el("button", {
      type: "button",
      class: "link",
      "aria-label": "dismiss",
      text: "×",
      onclick: () => item.remove(),
    }),
  );
  box.append(item);
  while (box.children.length > 4) box.firstElementChild.remove();
}

// -- rendering ---------------------------------------------------------------

function scheduleRender() {
  if (state.renderPending) return;
  state.renderPending = true;
  requestAnimationFrame(() => {
    state.renderPending = false;
    render();
  });
}

function render() {
  renderConversation();
  renderLane();
  renderQueue();
}

function sortedRuns() {
  return [...state.runs.values()].sort((a, b) => {
    const byTime = new Date(a.run.created_at) - new Date(b.run.created_at);
    return byTime || String(a.run.run_id).localeCompare(String(b.run.run_id));
  });
}

function questionText(interrupt) {
  if (interrupt === null || interrupt === undefined) return "";
  if (typeof interrupt === "string") return interrupt;
  for (const field of ["ask", "question", "prompt", "message"]) {
    if (typeof interrupt[field] === "string") return interrupt[field];
  }
  return JSON.stringify(interrupt);
}

function requestText(entry) {
  const run = entry.run;
  if (run.kind === "resume") {
    const asked = state.runs.get(run.resumed_from);
    const question = asked ? questionText(asked.run.interrupt) : "";
    if (run.resume_value !== undefined && run.resume_value !== null) {
      const value =
        typeof run.resume_value === "string" ? run.resume_value : JSON.stringify(run.resume_value);
      return `↩ ${value}`;
    }
    return question ? `↩ answered “${question}”` : "↩ answered the question";
  }
  const input = run.input;
  if (input && typeof input === "object" && typeof input.text === "string") return input.text;
  if (typeof input === "string") return input;
  return JSON.stringify(input);
}

function replyText(entry) {
  if (entry.text) return entry.text;
  const output = entry.run.output;
  if (!entry.ended || output === null || output === undefined) return "";
  if (typeof output === "string") return output;
  for (const field of ["answer", "text", "reply", "message"]) {
    if (typeof output[field] === "string") return output[field];
  }
  return JSON.stringify(output);
}

function replyNote(run) {
  switch (run.status) {
    case "pending":
      return run.attempts > 0 ? "retrying soon…" : "waiting for a worker…";
    case "running":
      return "";
    case "cancel_requested":
      return "stopping…";
    case "completed":
      return run.outcome === "steered" ? "ended early: a steer arrived" : "";
    case "cancelled":
      return "stopped";
    case "interrupted":
      return `asks: ${questionText(run.interrupt)}`;
    case "failed":
    case "dead": {
      const message = run.error ? run.error.message || run.error.code : "";
      return `${run.status}${message ? `: ${message}` : ""}`;
    }
    default:
      return run.status;
  }
}

function renderConversation() {
  const list = $("conversation");
  const nearBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 80;
  for (const entry of sortedRuns()) {
    if (!entry.node) {
      entry.node = el(
        "li",
        { class: "turn", dataset: { runId: entry.run.run_id } },
        el(
          "div",
          { class: "msg user" },
          el("div", { class: "text" }),
          el("div", { class: "meta" }),
        ),
        el(
          "div",
          { class: "msg reply" },
          el("div", { class: "text" }),
          el("div", { class: "note" }),
        ),
      );
    }
    const run = entry.run;
    const [user, reply] = entry.node.children;
    user.querySelector(".text").textContent = requestText(entry);
    user.querySelector(".meta").textContent = formatTime(run.created_at);
    reply.dataset.status = run.status;
    reply.dataset.outcome = run.outcome || "";
    const live = run.status === "running" || run.status === "pending";
    reply.classList.toggle("live", live);
    reply.querySelector(".text").textContent = replyText(entry);
    reply.querySelector(".note").textContent = replyNote(run);
    list.append(entry.node); // moves it into order; a no-op when in place
  }
  if (nearBottom) list.scrollTop = list.scrollHeight;
}

function renderLane() {
  const lane = state.lane;
  const badge = $("lane-state");
  badge.textContent = lane ? lane.state : "";
  badge.dataset.state = lane ? lane.state : "";
  const active = lane && lane.state === "running" ? lane.run_id : null;
  $("stop").hidden = !active;
  $("stop").dataset.runId = active || "";

  const interruptedRun =
    lane && lane.state === "interrupted" && lane.run_id ? state.runs.get(lane.run_id) : null;
  const key = lane
    ? `${lane.state}|${lane.run_id}|${lane.paused_reason}|${
        interruptedRun ? JSON.stringify(interruptedRun.run.interrupt) : ""
      }`
    : "";
  if (key === state.bannerKey) return; // keep a half-typed answer
  state.bannerKey = key;
  const banner = $("lane-banner");
  banner.replaceChildren();
  if (!lane) return;
  if (lane.state === "paused") {
    const why = PAUSE_REASONS[lane.paused_reason] || lane.paused_reason;
    banner.append(
      el(
        "div",
        { class: "banner paused", id: "paused-banner" },
        el("strong", { text: "Paused" }),
        el("span", { class: "why", text: ` ${why} (${lane.paused_reason}); the queue waits.` }),
        el("button", {
          type: "button",
          id: "continue",
          class: "primary",
          text: "Continue",
          onclick: continueLane,
        }),
      ),
    );
  } else if (lane.state === "interrupted" && lane.run_id) {
    if (!interruptedRun) {
      state.bannerKey = null; // render again once the run is read
      return;
    }
    const input = el("input", {
      id: "answer",
      autocomplete: "off",
      placeholder: "Your answer",
      "aria-label": "Answer",
    });
    const runId = lane.run_id;
    banner.append(
      el(
        "form",
        {
          class: "banner interrupted",
          id: "interrupt-form",
          onsubmit: (event) => {
            event.preventDefault();
            if (!input.value.trim()) return;
            resumeRun(runId, input.value.trim());
          },
        },
        el("strong", { text: "The agent asks:" }),
        el("span", { class: "question", text: questionText(interruptedRun.run.interrupt) }),
        input,
        el("button", { type: "submit", class: "primary", text: "Answer" }),
      ),
    );
  }
}

function renderQueue() {
  const lane = state.lane;
  const queued = lane ? lane.queued : [];
  $("queue-count").textContent = queued.length ? String(queued.length) : "";
  $("queue-empty").hidden = queued.length > 0;
  $("queue").classList.toggle("has-items", queued.length > 0);
  const key = JSON.stringify(queued.map((q) => [q.request_id, q.position, q.steer]));
  if (key === state.queueKey) return;
  state.queueKey = key;
  $("queue-list").replaceChildren(
    ...queued.map((item) =>
      el(
        "li",
        { class: `queued${item.steer ? " steer" : ""}`, dataset: { requestId: item.request_id } },
        el("span", { class: "position", text: `#${item.position ?? "?"}` }),
        el("span", { class: "text", text: requestText({ run: { input: item.input } }) }),
        item.steer ? el("span", { class: "tag steer", text: "steer" }) : null,
        el("span", { class: "spacer" }),
        item.steer
          ? null
          : el("button", {
              type: "button",
              class: "small promote",
              text: "Steer",
              title: "Answer this next, ending the running reply early",
              onclick: () => steerRequest(item.request_id),
            }),
        el("button", {
          type: "button",
          class: "small cancel",
          text: "Cancel",
          onclick: () => cancelRequest(item.request_id),
        }),
      ),
    ),
  );
}

// -- recent threads ----------------------------------------------------------

async function loadThreads() {
  if (!getKey()) return;
  try {
    const page = await api("GET", `/v1/runs${query({ agent: state.agent, limit: 200 })}`);
    const seen = new Map();
    for (const run of page.items) {
      if (run.thread_id && !seen.has(run.thread_id)) seen.set(run.thread_id, run);
    }
    if (state.thread && !seen.has(state.thread)) seen.set(state.thread, null);
    $("thread-list").replaceChildren(
      ...[...seen].map(([thread, run]) =>
        el(
          "li",
          { dataset: { thread } },
          el(
            "a",
            { href: `#${new URLSearchParams({ thread, agent: state.agent })}` },
            el("span", { class: "name", text: thread }),
            el("span", { class: "muted", text: run ? formatTime(run.created_at) : "new" }),
          ),
        ),
      ),
    );
    markCurrentThread();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) handleError(error);
  }
}

function markCurrentThread() {
  for (const item of $("thread-list").children) {
    item.classList.toggle("current", item.dataset.thread === state.thread);
  }
}

// -- wiring --------------------------------------------------------------------

let started = false;
let sendChain = Promise.resolve();

function start() {
  $("key-error").hidden = true;
  if (started) {
    state.lane = null;
    openFromHash();
    sync();
    loadThreads();
    return;
  }
  started = true;
  openFromHash();
  loadThreads();
  setInterval(() => {
    if (!document.hidden) sync();
  }, SYNC_MS);
  setInterval(() => {
    if (!document.hidden) loadThreads();
  }, THREADS_MS);
}

const keyGate = setupKeyGate({
  gate: $("key-gate"),
  form: $("key-form"),
  input: $("key-input"),
  status: $("key-status"),
  onReady: start,
});

$("forget-key").addEventListener("click", () => keyGate.forget());

window.addEventListener("hashchange", () => {
  if (getKey()) {
    openFromHash();
    loadThreads();
  }
});

$("new-thread").addEventListener("click", () => {
  writeHash(newThreadName(), $("agent-input").value.trim() || "demo");
});

$("thread-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const thread = $("thread-input").value.trim();
  const agent = $("agent-input").value.trim() || "demo";
  if (thread) writeHash(thread, agent);
});

$("composer").addEventListener("submit", async (event) => {
  event.preventDefault();
  const box = $("message");
  const text = box.value.trim();
  if (!text) return;
  const policy = new FormData($("composer")).get("policy") || "enqueue";
  box.value = "";
  // A steer is a one-off (one may wait per thread): back to enqueue.
  if (policy === "steer") $("composer").querySelector('input[value="enqueue"]').checked = true;
  // Submitted one after another, so that the server sees them in the order
  // they were typed (parallel requests may overtake each other).
  sendChain = sendChain.then(async () => {
    const sent = await send(text, policy);
    if (!sent && !box.value) box.value = text;
  });
});

$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

$("stop").addEventListener("click", () => {
  const id = $("stop").dataset.runId;
  if (id) stopRun(id);
});
