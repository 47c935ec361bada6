// The operations page: runs by status with filters and counts, a run's
// attempts and live events with actions, waiting lanes and workers. It reads
// only the public /v1 API (admin endpoints when the key is an admin's) and
// refreshes itself: SSE for the selected run, polling for the lists.

import {
  ApiError,
  TERMINAL,
  ago,
  api,
  duration,
  el,
  followStream,
  formatTime,
  getKey,
  query,
  setupKeyGate,
  shortId,
} from "./api.js";

const $ = (id) => document.getElementById(id);

const STATUSES = [
  "pending",
  "running",
  "cancel_requested",
  "interrupted",
  "completed",
  "failed",
  "dead",
  "cancelled",
];
const PAGE = 200;
const MAX_PAGES = 5; // counts cover at most the 1000 newest runs
const TABLE_ROWS = 100;
const LIST_MS = 2000;
const SIDE_MS = 4000;
const MAX_EVENTS = 300;

const state = {
  filters: { agent: "", status: "", thread: "" },
  runs: [],
  truncated: false,
  admin: null, // true, false, or null while unknown
  adminApi: true, // false when the server has no /v1/admin endpoints
  overview: null,
  selected: null, // {id, run, stream, events: [], lastSeq}
  refreshing: false,
};

// -- filters (kept in the URL hash, so a reload keeps them) ---------------------

function readFilters() {
  const params = new URLSearchParams(location.hash.slice(1));
  state.filters = {
    agent: params.get("agent") || "",
    status: params.get("status") || "",
    thread: params.get("thread") || "",
  };
  $("f-agent").value = state.filters.agent;
  $("f-status").value = state.filters.status;
  $("f-thread").value = state.filters.thread;
  const run = params.get("run");
  if (run && (!state.selected || state.selected.id !== run)) select(run);
}

function writeFilters(extra = {}) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries({ ...state.filters, ...extra })) {
    if (value) params.set(name, value);
  }
  if (state.selected && !("run" in extra)) params.set("run", state.selected.id);
  history.replaceState(null, "", `#${params}`);
}

// -- the runs list and counts -------------------------------------------------

async function refreshList() {
  if (!getKey() || state.refreshing) return;
  state.refreshing = true;
  try {
    const runs = [];
    let cursor = null;
    let pages = 0;
    do {
      const page = await api(
        "GET",
        `/v1/runs${query({
          agent: state.filters.agent,
          thread_id: state.filters.thread,
          limit: PAGE,
          cursor,
        })}`,
      );
      runs.push(...page.items);
      cursor = page.next_cursor;
      pages += 1;
    } while (cursor && pages < MAX_PAGES);
    state.runs = runs;
    state.truncated = Boolean(cursor);
    renderCounts();
    renderRuns();
    $("updated").textContent = `updated ${formatTime(new Date())}`;
    $("live").classList.remove("stale");
  } catch (error) {
    $("live").classList.add("stale");
    handleError(error);
  } finally {
    state.refreshing = false;
  }
}

function renderCounts() {
  const counts = Object.fromEntries(STATUSES.map((s) => [s, 0]));
  let oldestPending = null;
  const now = Date.now();
  for (const run of state.runs) {
    counts[run.status] = (counts[run.status] || 0) + 1;
    if (run.status === "pending" && new Date(run.available_at).getTime() <= now) {
      const since = new Date(run.available_at).getTime();
      if (oldestPending === null || since < oldestPending) oldestPending = since;
    }
  }
  const cards = STATUSES.map((status) =>
    el(
      "button",
      {
        type: "button",
        class: `count-card${state.filters.status === status ? " active" : ""}`,
        dataset: { status },
        onclick: () => {
          state.filters.status = state.filters.status === status ? "" : status;
          $("f-status").value = state.filters.status;
          writeFilters();
          renderCounts();
          renderRuns();
        },
      },
      el("span", { class: "n", text: String(counts[status]) }),
      el("span", { class: `badge`, dataset: { state: status }, text: status }),
    ),
  );
  const oldest =
    oldestPending === null ? "none" : duration(Math.max(0, (now - oldestPending) / 1000));
  cards.push(
    el(
      "div",
      { class: "count-card static", id: "oldest-pending" },
      el("span", { class: "n", text: oldest }),
      el("span", { class: "muted", text: "oldest pending" }),
    ),
  );
  $("counts").replaceChildren(...cards);
  const scope = [
    state.filters.agent && `agent ${state.filters.agent}`,
    state.filters.thread && `thread ${state.filters.thread}`,
  ].filter(Boolean);
  let note = `Counted over ${state.runs.length}${state.truncated ? " newest" : ""} runs`;
  if (scope.length) note += ` of ${scope.join(", ")}`;
  if (state.admin === false) note += " (your own runs: not an admin key)";
  if (state.overview && !scope.length) {
    const dead = state.overview.dead;
    note += ` · dead letter: ${dead}`;
  }
  $("counts-note").textContent = `${note}.`;
}

function visibleRuns() {
  const status = state.filters.status;
  return status ? state.runs.filter((r) => r.status === status) : state.runs;
}

function took(run) {
  if (!run.started_at) return "";
  const end = run.finished_at ? new Date(run.finished_at) : new Date();
  return duration((end - new Date(run.started_at)) / 1000);
}

function renderRuns() {
  const runs = visibleRuns();
  const rows = runs.slice(0, TABLE_ROWS).map((run) =>
    el(
      "tr",
      {
        class: state.selected && state.selected.id === run.run_id ? "selected" : "",
        dataset: { runId: run.run_id, status: run.status },
        tabindex: "0",
        onclick: () => select(run.run_id),
        onkeydown: (event) => {
          if (event.key === "Enter") select(run.run_id);
        },
      },
      el("td", { class: "mono", text: shortId(run.run_id) }),
      el("td", { text: run.agent }),
      el("td", { class: "mono", text: run.thread_id || "—" }),
      el(
        "td",
        {},
        el("span", { class: "badge", dataset: { state: run.status }, text: run.status }),
        run.outcome ? el("span", { class: "muted", text: ` ${run.outcome}` }) : null,
      ),
      el("td", { text: `${run.attempts}/${run.max_attempts}` }),
      el("td", { title: run.created_at, text: `${ago(run.created_at)} ago` }),
      el("td", { text: took(run) }),
    ),
  );
  $("runs").tBodies[0].replaceChildren(...rows);
  $("runs-empty").hidden = runs.length > 0;
  $("runs-shown").textContent =
    runs.length > TABLE_ROWS ? `${TABLE_ROWS} of ${runs.length}` : String(runs.length);
}

// -- one run: detail, attempts, live events, actions ----------------------------

function select(id) {
  if (state.selected && state.selected.id === id) return;
  if (state.selected && state.selected.stream) state.selected.stream.close();
  state.selected = { id, run: null, stream: null, events: [], lastSeq: 0 };
  writeFilters();
  renderRuns();
  $("detail").replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  refreshDetail().then(() => openEvents(state.selected));
}

async function refreshDetail() {
  const selected = state.selected;
  if (!selected) return;
  try {
    const run = await api("GET", `/v1/runs/${selected.id}`);
    if (state.selected !== selected) return;
    selected.run = run;
    renderDetail();
  } catch (error) {
    if (state.selected !== selected) return;
    if (error instanceof ApiError && error.status === 404) {
      $("detail").replaceChildren(el("p", { class: "error", text: `No run ${selected.id}.` }));
      selected.missing = true;
    } else {
      handleError(error);
    }
  }
}

function openEvents(selected) {
  if (!selected || selected.missing || state.selected !== selected) return;
  selected.stream = followStream(`/v1/runs/${selected.id}/events`, {
    lastEventId: selected.lastSeq || null,
    isFinal: (event) => event.event === "end",
    onEvent: (event) => {
      if (state.selected !== selected) return;
      if (event.event === "end") {
        refreshDetail();
        return;
      }
      const data = event.data || {};
      if (typeof data.seq === "number") {
        if (data.seq <= selected.lastSeq) return;
        selected.lastSeq = data.seq;
      }
      selected.events.push(data);
      if (selected.events.length > MAX_EVENTS) selected.events.shift();
      appendEvent(data);
    },
    onError: (error) => handleError(error),
  });
}

function eventRow(event) {
  const data = event.data === undefined ? "" : JSON.stringify(event.data);
  return el(
    "li",
    { dataset: { kind: event.kind } },
    el("span", { class: "seq", text: `#${event.seq}` }),
    el("span", { class: "kind", text: event.kind }),
    el("span", { class: "data", text: data }),
    el("span", { class: "muted", text: `a${event.attempt ?? "?"}` }),
  );
}

function appendEvent(event) {
  const list = document.getElementById("events");
  if (!list) return;
  const nearBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  list.append(eventRow(event));
  while (list.children.length > MAX_EVENTS) list.firstElementChild.remove();
  $("events-count").textContent = String(state.selected.lastSeq);
  if (nearBottom) list.scrollTop = list.scrollHeight;
}

function field(name, value, cls = "") {
  return [el("dt", { text: name }), el("dd", { class: cls }, value ?? "—")];
}

function json(value) {
  return el("pre", { class: "json", text: JSON.stringify(value, null, 2) });
}

function renderDetail() {
  const selected = state.selected;
  const run = selected.run;
  const eventsList = document.getElementById("events");
  const scroll = eventsList ? eventsList.scrollTop : null;
  const inputOpen = Boolean(document.querySelector("#detail details.input[open]"));
  const actions = [];
  if (!TERMINAL.has(run.status) && run.status !== "cancel_requested") {
    actions.push(
      el("button", {
        type: "button",
        id: "action-cancel",
        class: "danger",
        text: "Cancel run",
        onclick: () => act(`/v1/runs/${run.run_id}/cancel`, "cancel requested"),
      }),
    );
  }
  if (run.status === "failed" || run.status === "dead") {
    actions.push(
      el("button", {
        type: "button",
        id: "action-retry",
        class: "primary",
        text: "Retry",
        disabled: state.admin === false,
        title: state.admin === false ? "needs an admin key" : "re-queue this run",
        onclick: () => act(`/v1/runs/${run.run_id}/retry`, "re-queued"),
      }),
    );
  }
  if (run.thread_id) {
    const hash = new URLSearchParams({ thread: run.thread_id, agent: run.agent });
    actions.push(el("a", { class: "button", href: `./#${hash}`, text: "Open thread in chat" }));
  }
  const attempts = run.attempt_history || [];
  const body = [
    el(
      "div",
      { class: "detail-head" },
      el("h2", { class: "mono", text: shortId(run.run_id) }),
      el("span", { class: "badge", id: "detail-status", dataset: { state: run.status } }, run.status),
      run.outcome ? el("span", { class: "muted", text: run.outcome }) : null,
      el("span", { class: "spacer" }),
      ...actions,
    ),
    el(
      "dl",
      { class: "fields" },
      ...field("run id", run.run_id, "mono"),
      ...field("agent", run.agent),
      ...field("kind", run.kind),
      ...field("thread", run.thread_id, "mono"),
      ...(run.resumed_from ? field("resumes", shortId(run.resumed_from), "mono") : []),
      ...field("attempts", `${run.attempts} of ${run.max_attempts}`),
      ...field("priority", String(run.priority)),
      ...field("created", formatTime(run.created_at)),
      ...field("started", formatTime(run.started_at)),
      ...field("finished", formatTime(run.finished_at)),
      ...(run.worker_id ? field("worker", run.worker_id, "mono") : []),
    ),
    el("h3", { text: "Attempts" }),
    attempts.length
      ? el(
          "table",
          { class: "runs attempts", id: "attempts" },
          el(
            "thead",
            {},
            el(
              "tr",
              {},
              ...["#", "worker", "started", "ended", "outcome", "error"].map((h) =>
                el("th", { text: h }),
              ),
            ),
          ),
          el(
            "tbody",
            {},
            ...attempts.map((a) =>
              el(
                "tr",
                {},
                el("td", { text: String(a.attempt) }),
                el("td", {
                  class: "mono",
                  text: a.worker_id || (state.admin ? "—" : "(admin only)"),
                }),
                el("td", { text: formatTime(a.started_at) }),
                el("td", { text: formatTime(a.ended_at) }),
                el("td", {}, a.outcome ? el("span", { class: "badge", dataset: { state: a.outcome }, text: a.outcome }) : "running"),
                el("td", { class: "error-text", text: a.error ? a.error.message || a.error.code : "" }),
              ),
            ),
          ),
        )
      : el("p", { class: "muted", text: "Not claimed yet." }),
    run.interrupt !== null && run.interrupt !== undefined
      ? el("div", {}, el("h3", { text: "Interrupt" }), json(run.interrupt))
      : null,
    run.error ? el("div", {}, el("h3", { text: "Error" }), json(run.error)) : null,
    run.output !== null && run.output !== undefined
      ? el("div", {}, el("h3", { text: "Output" }), json(run.output))
      : null,
    el(
      "details",
      { class: "input", open: inputOpen },
      el("summary", { text: "Input" }),
      json(run.input),
    ),
    el(
      "h3",
      {},
      "Events ",
      el("span", { class: "count", id: "events-count", text: String(selected.lastSeq) }),
      TERMINAL.has(run.status) ? null : el("span", { class: "live-dot", text: "live" }),
    ),
    el("ol", { id: "events", class: "events" }, ...selected.events.map(eventRow)),
  ];
  $("detail").replaceChildren(...body.filter(Boolean));
  const list = document.getElementById("events");
  list.scrollTop = scroll === null ? list.scrollHeight : scroll;
}

async function act(path, done) {
  try {
    await api("POST", path);
    notice(done, "info");
  } catch (error) {
    if (error instanceof ApiError) {
      notice(`${error.code}: ${error.message}`, "error");
    } else {
      handleError(error);
    }
  }
  const selected = state.selected;
  await refreshDetail();
  // A retried run streams again: follow it.
  if (selected && state.selected === selected && (!selected.stream || selected.stream.finished)) {
    openEvents(selected);
  }
  refreshList();
}

// -- lanes and workers ------------------------------------------------------------

async function refreshSide() {
  if (!getKey()) return;
  await detectAdmin();
  await Promise.all([refreshLanes(), refreshWorkers()]);
}

async function detectAdmin() {
  if (!state.adminApi) return;
  try {
    state.overview = await api("GET", "/v1/admin/overview");
    state.admin = true;
  } catch (error) {
    state.overview = null;
    if (error instanceof ApiError && error.status === 403) state.admin = false;
    else if (error instanceof ApiError && (error.status === 404 || error.status === 405)) {
      state.adminApi = false;
    } else handleError(error);
  }
  const role = $("role");
  role.textContent = state.admin === true ? "admin" : state.admin === false ? "user" : "";
  role.dataset.state = state.admin ? "admin" : "";
}

async function refreshLanes() {
  let lanes = [];
  if (state.overview) {
    lanes = state.overview.waiting_lanes.map((lane) => ({
      thread: lane.thread_id,
      agent: lane.agent,
      user: lane.user_id,
      state: lane.interrupted_run_id ? "interrupted" : "paused",
      why: lane.interrupted_run_id
        ? `run ${shortId(lane.interrupted_run_id)} asks a question`
        : lane.paused_reason,
      queued: lane.queued,
    }));
  } else {
    // Without the admin overview: read the lanes of the threads whose
    // latest run could have paused or interrupted them.
    const latest = new Map();
    for (const run of state.runs) {
      if (!run.thread_id) continue;
      const key = `${run.agent}\u0000${run.thread_id}`;
      if (!latest.has(key)) latest.set(key, run);
    }
    const candidates = [...latest.values()]
      .filter((run) => ["cancelled", "failed", "dead", "interrupted"].includes(run.status))
      .slice(0, 20);
    const snapshots = await Promise.all(
      candidates.map((run) =>
        api(
          "GET",
          `/v1/threads/${encodeURIComponent(run.thread_id)}/queue${query({ agent: run.agent })}`,
        ).catch(() => null),
      ),
    );
    lanes = snapshots
      .filter((s) => s && (s.state === "paused" || s.state === "interrupted"))
      .map((s) => ({
        thread: s.thread_id,
        agent: s.agent,
        state: s.state,
        why: s.state === "paused" ? s.paused_reason : `run ${shortId(s.run_id)} asks a question`,
        queued: s.queued.length,
      }));
  }
  $("lanes-count").textContent = lanes.length ? String(lanes.length) : "";
  $("lanes-empty").hidden = lanes.length > 0;
  $("lanes").hidden = lanes.length === 0;
  $("lanes").tBodies[0].replaceChildren(
    ...lanes.map((lane) => {
      const hash = new URLSearchParams({ thread: lane.thread, agent: lane.agent });
      return el(
        "tr",
        { dataset: { thread: lane.thread, state: lane.state } },
        el("td", { class: "mono" }, el("a", { href: `./#${hash}`, text: lane.thread })),
        el("td", { text: lane.agent }),
        el("td", { class: "mono", text: lane.user || "you" }),
        el("td", {}, el("span", { class: "badge", dataset: { state: lane.state }, text: lane.state })),
        el("td", { text: lane.why || "" }),
        el("td", { text: String(lane.queued) }),
        el(
          "td",
          {},
          lane.state === "paused"
            ? el("button", {
                type: "button",
                class: "small",
                text: "Continue",
                title: "dispatch the head of the queue (your own lanes)",
                onclick: async () => {
                  const path = `/v1/threads/${encodeURIComponent(lane.thread)}/queue/continue`;
                  try {
                    await api("POST", `${path}${query({ agent: lane.agent })}`);
                    notice(`continued ${lane.thread}`, "info");
                  } catch (error) {
                    // The API continues the key's own user's lane only.
                    const mine = lane.user ? ` (only your own lanes; this is ${lane.user}'s)` : "";
                    notice(`continue ${lane.thread}: ${error.message}${mine}`, "error");
                  }
                  refreshSide();
                  refreshList();
                },
              })
            : null,
        ),
      );
    }),
  );
}

async function refreshWorkers() {
  const box = $("workers");
  if (!state.adminApi) {
    box.replaceChildren(
      el("p", { class: "muted", id: "workers-na", text: "Not available: this server has no /v1/admin/workers." }),
    );
    return;
  }
  if (state.admin === false) {
    box.replaceChildren(
      el("p", { class: "muted", id: "workers-na", text: "Not available: workers are shown to admin keys." }),
    );
    return;
  }
  try {
    const workers = await api("GET", "/v1/admin/workers");
    const alive = workers.filter((w) => w.alive);
    $("workers-count").textContent = `${alive.length} alive`;
    box.replaceChildren(
      workers.length
        ? el(
            "table",
            { class: "runs", id: "workers-table" },
            el(
              "thead",
              {},
              el(
                "tr",
                {},
                ...["worker", "host", "agents", "busy", "last seen", ""].map((h) =>
                  el("th", { text: h }),
                ),
              ),
            ),
            el(
              "tbody",
              {},
              ...workers.map((w) =>
                el(
                  "tr",
                  { dataset: { alive: String(w.alive) } },
                  el("td", { class: "mono", text: w.id }),
                  el("td", { text: `${w.hostname}:${w.pid}` }),
                  el("td", { text: w.agents ? w.agents.join(", ") : "any" }),
                  el("td", { text: `${w.running}/${w.concurrency}` }),
                  el("td", { text: `${ago(w.last_seen_at)} ago` }),
                  el(
                    "td",
                    {},
                    el("span", {
                      class: "badge",
                      dataset: { state: w.alive ? "running" : "cancelled" },
                      text: w.alive ? "alive" : w.stopped_at ? "stopped" : "lost",
                    }),
                  ),
                ),
              ),
            ),
          )
        : el("p", { class: "muted", text: "No worker has been seen lately." }),
    );
  } catch (error) {
    if (error instanceof ApiError && (error.status === 404 || error.status === 405)) {
      state.adminApi = false;
      refreshWorkers();
    } else {
      box.replaceChildren(el("p", { class: "error", text: `workers: ${error.message}` }));
    }
  }
}

// -- errors and notices ---------------------------------------------------------

function handleError(error) {
  if (error instanceof ApiError && error.status === 401) {
    keyGate.forget();
    $("key-error").hidden = false;
    $("key-error").textContent = `The key was refused: ${error.message}`;
    return;
  }
  notice(error.message || String(error), "error");
}

function notice(text, kind) {
  const box = $("notices");
  const item = el(
    "div",
    { class: `notice ${kind}`, role: "status" },
    el("span", { text }),
    el("button", { type: "button", class: "link", text: "×", onclick: () => item.remove() }),
  );
  box.append(item);
  setTimeout(() => item.remove(), 8000);
  while (box.children.length > 3) box.firstElementChild.remove();
}

// -- wiring ------------------------------------------------------------------------

let started = false;

function start() {
  $("key-error").hidden = true;
  readFilters();
  refreshSide().then(() => {
    renderCounts();
    if (state.selected && state.selected.run) renderDetail();
  });
  refreshList();
  if (started) return;
  started = true;
  setInterval(() => {
    if (document.hidden) return;
    refreshList();
    const selected = state.selected;
    if (selected && selected.run && !TERMINAL.has(selected.run.status)) refreshDetail();
  }, LIST_MS);
  setInterval(() => {
    if (!document.hidden) refreshSide();
  }, SIDE_MS);
}

const keyGate = setupKeyGate({
  gate: $("key-gate"),
  form: $("key-form"),
  input: $("key-input"),
  status: $("key-status"),
  onReady: start,
});

$("forget-key").addEventListener("click", () => keyGate.forget());

$("filters").addEventListener("submit", (event) => {
  event.preventDefault();
  state.filters = {
    agent: $("f-agent").value.trim(),
    status: $("f-status").value,
    thread: $("f-thread").value.trim(),
  };
  writeFilters();
  refreshList();
});

$("f-status").addEventListener("change", () => {
  state.filters.status = $("f-status").value;
  writeFilters();
  renderCounts();
  renderRuns();
});

$("f-clear").addEventListener("click", () => {
  state.filters = { agent: "", status: "", thread: "" };
  $("f-agent").value = "";
  $("f-status").value = "";
  $("f-thread").value = "";
  writeFilters();
  refreshList();
});
