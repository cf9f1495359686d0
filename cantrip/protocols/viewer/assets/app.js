// The cantrip loom viewer: plain JavaScript, no build step, no dependencies.
//
// Pages (hash routes): #/ entities; #/e/ENTITY[/t/TURN] an entity's loom tree
// and one turn; #/thread/TURN a thread as a chat transcript; #/evals eval runs (evals.js);
// #/memory the loom's memory store (memory.js). Every list is read
// a page at a time from /api/ (the server never sends a whole loom); the tree
// is virtualised, so only the rows on screen exist in the DOM.
//
// Live (under `cantrip serve`): the entity page follows the session's
// GET /sessions/{id}/events stream, prompts with POST .../prompt?stream=1,
// cancels with POST .../cancel and forks with POST /api/fork.
//
// Loom text is data: every node is built with textContent, never innerHTML.
"use strict";

// The token arrives once as ?token= (a browser cannot send a header when it opens
// a page). It moves to this tab's sessionStorage and out of the address at once, so
// it is not kept in history or bookmarks, nor shown on screen (the server also sends
// Referrer-Policy: no-referrer).
const TOKEN_KEY = "cantrip-token";
const TOKEN = (() => {
  const query = new URLSearchParams(location.search);
  const given = query.get("token");
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    query.delete("token");
    const rest = query.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
  return given || sessionStorage.getItem(TOKEN_KEY);
})();
const ROW_HEIGHT = 26;
const TREE_PAGE = 200;
const LIST_PAGE = 50;
const THREAD_PAGE = 100;
const state = { live: false, view: null };

// -- plumbing ----------------------------------------------------------------------

function authHeaders(extra) {
  const headers = Object.assign({}, extra || {});
  if (TOKEN) headers["Authorization"] = "Bearer " + TOKEN;
  return headers;
}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = authHeaders(opts.headers);
  const response = await fetch(path, opts);
  let data = {};
  try { data = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) {
    const error = new Error((data.error && data.error.message) || response.statusText);
    error.status = response.status;
    error.code = data.error && data.error.code;
    throw error;
  }
  return data;
}

function postJSON(path, body) {
  return api(path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body || {}),
  });
}

// Server-sent events over fetch (EventSource cannot send an Authorization header).
async function readSSE(response, onEvent, onComment) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) { if (onComment) onComment(line.slice(1).trim()); }
        else if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (data.length) onEvent(name, JSON.parse(data.join("\n")));
    }
  }
}

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "style") Object.assign(node.style, value); // CSSOM: allowed by the CSP
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function badge(kind, text) { return el("span", { class: "badge " + kind, text: text || kind }); }

// A result the loom stored only in part (max_record_chars): how much, and the whole's hash.
function resultCut(cut) {
  const b = badge("cut", `stored ${cut.kept} of ${cut.chars} characters`);
  b.title = `sha256 ${cut.sha256}`;
  return b;
}

function showError(error) {
  const box = document.getElementById("error");
  box.textContent = error ? String(error.message || error) : "";
}

// The server says what a cost is (null: unknown -- tokens at an unknown price, no usage
// reported, or a turn cut off before its usage was recorded); the page never guesses $0.
function cost(value) {
  if (value === null || value === undefined) return "cost unknown";
  return "$" + Number(value).toFixed(value < 0.01 ? 6 : 4);
}

function tokenTotal(tokens) { return tokens ? tokens.prompt + tokens.completion : 0; }

function when(stamp) {
  if (!stamp) return "";
  const date = new Date(stamp);
  return isNaN(date) ? stamp : date.toLocaleString();
}

function sessionOf(entityId) { return "session-" + entityId.replace(/^entity-/, ""); }

function pretty(value) {
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

// A long text shows its start and a button for the rest (a 1 MB observation
// should not stall the page).
function longText(text, cls) {
  const LIMIT = 4000;
  const pre = el("pre", { class: cls || "" });
  if (text.length <= LIMIT) { pre.textContent = text; return pre; }
  pre.textContent = text.slice(0, LIMIT);
  const more = el("button", { text: `show all ${text.length} characters`, onclick: () => {
    pre.textContent = text; more.remove();
  } });
  return el("div", {}, pre, more);
}

// -- code highlighting (a small tokenizer for Python and JavaScript) ---------------

const KEYWORDS = new Set((
  "and as assert async await break class const continue def del elif else except false " +
  "finally for from function global if import in is lambda let new nonlocal none not null " +
  "or pass raise return this throw true try typeof undefined var while with yield"
).split(" "));
const TOKENS = /(#[^\n]*|\/\/[^\n]*)|("""[\s\S]*?"""|'''[\s\S]*?'''|`(?:\\.|[^`\\])*`|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')|(\b\d[\d_.eExX]*\b)|([A-Za-z_$][\w$]*)/g;

function highlight(code) {
  const pre = el("pre", { class: "code" });
  let last = 0;
  for (const match of code.matchAll(TOKENS)) {
    if (match.index > last) pre.append(code.slice(last, match.index));
    const [text, comment, string, number, word] = match;
    if (comment) pre.append(el("span", { class: "com", text }));
    else if (string) pre.append(el("span", { class: "str", text }));
    else if (number) pre.append(el("span", { class: "num", text }));
    else if (word && KEYWORDS.has(word.toLowerCase()) && word === word.toLowerCase() || word === "True" || word === "False" || word === "None")
      pre.append(el("span", { class: "kw", text }));
    else pre.append(text);
    last = match.index + text.length;
  }
  if (last < code.length) pre.append(code.slice(last));
  return pre;
}

// -- routing -------------------------------------------------------------------------

function route() {
  showError(null);
  if (state.view && state.view.close) state.view.close();
  state.view = null;
  const raw = location.hash.replace(/^#/, "");
  const main = document.getElementById("main");
  main.replaceChildren();
  if ((state.view = memoryRoute(raw, main))) return; // memory.js: #/memory, #/memory/item (undecoded)
  const hash = decodeURIComponent(raw) || "/";
  let match;
  if ((state.view = evalRoute(hash, main))) return; // evals.js: #/evals, #/evals/RUN, #/evals/A/vs/B
  if ((match = hash.match(/^\/compare(?:\/([^/]*)\/([^/]*))?$/))) {
    state.view = new ComparePage(main, match[1] || "", match[2] || "");
  } else if ((match = hash.match(/^\/e\/([^/]+)\/timeline$/))) {
    state.view = new TimelinePage(main, match[1]);
  } else if ((match = hash.match(/^\/e\/([^/]+)(?:\/t\/([^/]+))?$/))) {
    state.view = new EntityPage(main, match[1], match[2] || null);
  } else if ((match = hash.match(/^\/thread\/([^/]+)$/))) {
    state.view = new ThreadPage(main, match[1]);
  } else {
    state.view = new EntityList(main);
  }
}

async function start() {
  try {
    const loom = await api("/api/loom");
    state.live = loom.live;
    document.getElementById("source").textContent = loom.source || "";
    document.getElementById("mode").textContent = loom.live
      ? "live" : `read-only · ${loom.turns} turns · ${loom.entities} entities`;
  } catch (error) {
    showError(error);
  }
  window.addEventListener("hashchange", route);
  route();
}

// -- the entity list -----------------------------------------------------------------

class EntityList {
  constructor(main) {
    this.offset = 0;
    this.query = "";
    this.search = el("input", { type: "search", placeholder: "search id or intent…", "aria-label": "search" });
    let timer = null;
    this.search.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => { this.query = this.search.value; this.offset = 0; this.load(); }, 200);
    });
    this.runs = el("select", { id: "eval-runs", "aria-label": "eval runs", hidden: true,
      onchange: () => { this.search.value = this.runs.value; this.query = this.runs.value; this.offset = 0; this.load(); } });
    const toolbar = el("div", { class: "toolbar" }, this.search, this.runs);
    this.loadRuns();
    if (state.live) {
      toolbar.append(el("button", { class: "primary", id: "new-session", text: "New session",
        onclick: () => this.newSession() }));
    }
    this.body = el("div", { class: "list" });
    main.append(toolbar, this.body);
    this.load();
  }

  async loadRuns() {
    // The eval runs this loom records: choosing one lists its cases' entities.
    let runs;
    try { runs = await api("/api/evals"); } catch (error) { showError(error); return; }
    if (!runs.items.length) return;
    this.runs.replaceChildren(el("option", { value: "", text: "all entities" }),
      ...runs.items.map((r) => el("option", { value: r.run_id, text: `${r.run_id} (${r.passed} passed, ${r.failed + r.errored} not)` })));
    this.runs.hidden = false;
  }

  async newSession() {
    try {
      const session = await postJSON("/sessions");
      location.hash = "#/e/" + session.entity_id;
    } catch (error) { showError(error); }
  }

  async load() {
    const params = new URLSearchParams({ offset: this.offset, limit: LIST_PAGE });
    if (this.query) params.set("q", this.query);
    let page;
    try { page = await api("/api/entities?" + params); } catch (error) { showError(error); return; }
    const rows = page.items.map((e) => el("tr", {
      class: "entity", dataset: { entity: e.entity_id },
      onclick: () => { location.hash = "#/e/" + e.entity_id; },
    },
      el("td", { class: "mono" }, e.entity_id,
        e.parent_entity_id ? el("div", { class: "muted", text: "child of " + e.parent_entity_id }) : null,
        e.forked_from ? el("div", { class: "muted", text: "forked from " + e.forked_from }) : null),
      el("td", {}, e.running ? badge("running") : badge(e.status)),
      el("td", { class: "intent" }, e.eval ? badge("eval", `${e.eval.case}${e.eval.repeat ? " #" + (e.eval.repeat + 1) : ""}`) : null,
        e.eval ? " " : null, e.intent),
      el("td", { text: String(e.turns) }),
      el("td", { text: String(tokenTotal(e.tokens)) }),
      el("td", { text: cost(e.tree_cost_usd) }),
      el("td", { text: when(e.last_activity) }),
    ));
    const table = el("table", { class: "entities" },
      el("thead", {}, el("tr", {}, ...["entity", "status", "intent", "turns", "tokens", "cost (tree)", "last activity"]
        .map((h) => el("th", { text: h })))),
      el("tbody", {}, rows));
    const last = Math.min(page.offset + page.items.length, page.total);
    const pager = el("div", { class: "pager" },
      el("button", { text: "‹ prev", disabled: page.offset === 0,
        onclick: () => { this.offset = Math.max(0, this.offset - LIST_PAGE); this.load(); } }),
      el("span", { class: "muted", text: page.total ? `${page.offset + 1}–${last} of ${page.total}` : "no entities yet" }),
      el("button", { text: "next ›", disabled: last >= page.total,
        onclick: () => { this.offset += LIST_PAGE; this.load(); } }));
    this.body.replaceChildren(table, pager);
  }
}

// -- an entity: its tree, one turn, the live controls ----------------------------------

class TreeList {
  // A virtualised list of the entity's tree rows: a spacer as tall as every
  // row, and only the rows in view (plus a margin) rendered, fetched a page
  // at a time and cached.
  constructor(container, entityId, onSelect) {
    this.container = container;
    this.entityId = entityId;
    this.onSelect = onSelect;
    this.pages = new Map();
    this.loading = new Set();
    this.total = 0;
    this.selected = null;
    this.spacer = el("div", { class: "spacer" });
    this.container.replaceChildren(this.spacer);
    this.frame = 0;
    this.container.addEventListener("scroll", () => this.schedule());
    this.painted = false;
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => { this.frame = 0; this.render(); });
  }

  async fetchPage(number, around) {
    const params = new URLSearchParams({ limit: TREE_PAGE });
    if (around) params.set("turn", around); else params.set("offset", number * TREE_PAGE);
    const page = await api(`/api/entities/${encodeURIComponent(this.entityId)}/tree?` + params);
    this.total = page.total;
    this.forkedFrom = page.forked_from;
    this.pages.set(page.offset / TREE_PAGE, page.items);
    return page;
  }

  async open(around) {
    const page = await this.fetchPage(0, around);
    this.spacer.style.height = this.total * ROW_HEIGHT + "px";
    if (page.index !== null && page.index !== undefined) {
      this.container.scrollTop = Math.max(0, page.index * ROW_HEIGHT - this.container.clientHeight / 3);
    }
    this.render();
    return page;
  }

  // New turns arrived: drop the cached tail, grow, and follow the end if we were there.
  async refresh() {
    const atEnd = this.container.scrollTop + this.container.clientHeight >= this.spacer.offsetHeight - ROW_HEIGHT * 2;
    const lastPage = Math.max(0, Math.floor((this.total - 1) / TREE_PAGE));
    this.pages.delete(lastPage);
    this.pages.delete(lastPage + 1);
    await this.fetchPage(lastPage);
    if ((this.total - 1) / TREE_PAGE >= lastPage + 1) await this.fetchPage(lastPage + 1);
    this.spacer.style.height = this.total * ROW_HEIGHT + "px";
    if (atEnd) this.container.scrollTop = this.spacer.offsetHeight;
    this.render();
  }

  load(number) {
    if (this.loading.has(number)) return;
    this.loading.add(number);
    this.fetchPage(number)
      .then(() => this.render())
      .catch(showError)
      .finally(() => this.loading.delete(number));
  }

  render() {
    const top = this.container.scrollTop;
    const height = this.container.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - 10);
    const last = Math.min(this.total, Math.ceil((top + height) / ROW_HEIGHT) + 10);
    const rows = [];
    for (let index = first; index < last; index++) {
      const page = this.pages.get(Math.floor(index / TREE_PAGE));
      const item = page && page[index % TREE_PAGE];
      if (!item) {
        this.load(Math.floor(index / TREE_PAGE));
        rows.push(el("div", { class: "row placeholder", style: { top: index * ROW_HEIGHT + "px" }, text: "…" }));
        continue;
      }
      rows.push(this.row(item, index));
    }
    this.spacer.replaceChildren(...rows);
    if (!this.painted && rows.length) {
      this.painted = true;
      requestAnimationFrame(() => performance.mark("cantrip-tree-painted"));
    }
  }

  row(item, index) {
    const marks = [];
    if (item.branch === "fork") marks.push(el("span", { class: "branch badge fork", title: "a fork starts here", text: "fork" }));
    if (item.branch === "child") marks.push(el("span", { class: "branch badge child", title: "a call_agent child starts here", text: "child" }));
    if (item.branch === "rollback") marks.push(el("span", { class: "branch badge rollback", title: "the entity was rewound from here: no longer its thread", text: "rollback" }));
    const status = item.status === "ok" ? null : badge(item.status);
    return el("div", {
      class: "row" + (item.id === this.selected ? " selected" : ""),
      style: { top: index * ROW_HEIGHT + "px", paddingLeft: 6 + item.depth * 18 + "px" },
      dataset: { turn: item.id, index: String(index) },
      title: item.id,
      onclick: () => this.onSelect(item.id),
    },
      marks,
      el("span", { class: "seq", text: "#" + item.sequence }),
      status, " ",
      item.ephemeral ? badge("ephemeral") : null,
      item.intent ? el("span", { class: "muted", text: "» " + item.intent + " " }) : null,
      item.gates.map((g) => el("span", { class: "gate", text: g })),
      el("span", { class: "preview", text: item.preview }));
  }

  select(turnId) {
    this.selected = turnId;
    this.render();
  }
}

class EntityPage {
  constructor(main, entityId, turnId) {
    this.entityId = entityId;
    this.sessionId = sessionOf(entityId);
    this.abort = new AbortController();
    this.running = false;
    this.head = el("div", { class: "entity-head" }, el("span", { class: "id mono", text: entityId }));
    this.treeBox = el("div", { class: "tree", id: "tree" });
    this.left = el("div", { class: "left" }, this.treeBox);
    this.right = el("div", { class: "right", id: "detail" },
      el("p", { class: "muted", text: "select a turn to see its utterance and gate calls" }));
    main.append(this.head, el("div", { class: "split" }, this.left, this.right));
    this.tree = new TreeList(this.treeBox, entityId, (id) => this.selectTurn(id));
    this.open(turnId);
  }

  close() { this.abort.abort(); }

  async open(turnId) {
    // The tree's first page and the entity's summary are fetched side by side.
    const opening = this.tree.open(turnId);
    let summary = null;
    try {
      const found = await api("/api/entities?" + new URLSearchParams({ q: this.entityId, limit: 5 }));
      summary = found.items.find((e) => e.entity_id === this.entityId) || null;
    } catch (error) { showError(error); }
    this.summary = summary;
    this.renderHead();
    try {
      await opening;
      this.renderHead();
    } catch (error) {
      if (error.code !== "unknown_entity") showError(error);
      this.treeBox.replaceChildren(el("p", { class: "empty muted", text: "no turns yet" }));
    }
    if (turnId) this.selectTurn(turnId);
    if (state.live && !(summary && summary.parent_entity_id)) this.startLive();
  }

  renderHead() {
    const s = this.summary;
    const parts = [el("span", { class: "id mono", text: this.entityId })];
    if (s) {
      parts.push(this.running || s.running ? badge("running") : badge(s.status),
        el("span", { class: "muted", text: `${s.medium} · ${s.turns} turns · ${tokenTotal(s.tokens)} tokens · ${cost(s.cost_usd)} (tree ${cost(s.tree_cost_usd)})` }));
      if (s.parent_entity_id) parts.push(el("a", { href: "#/e/" + s.parent_entity_id, text: "parent " + s.parent_entity_id }));
    }
    const forked = (s && s.forked_from) || this.tree.forkedFrom;
    if (forked) parts.push(el("a", { href: "#/thread/" + forked, text: "forked from " + forked }));
    parts.push(el("a", { id: "open-timeline", href: `#/e/${this.entityId}/timeline`, text: "timeline" }));
    this.head.replaceChildren(...parts);
  }

  async selectTurn(turnId) {
    this.tree.select(turnId);
    history.replaceState(null, "", `#/e/${this.entityId}/t/${turnId}`);
    let turn;
    try { turn = await api("/api/turns/" + encodeURIComponent(turnId)); } catch (error) { showError(error); return; }
    // A fork intent typed into this turn's panel while it was fetched again is kept:
    // the panel is replaced only once the turn arrives, and it was lost with the old one.
    const typed = this.right.querySelector(`#fork-intent[data-turn="${CSS.escape(turn.id)}"]`);
    const focused = typed !== null && document.activeElement === typed;
    this.right.replaceChildren(renderTurn(turn, (id, intent) => forkFrom(id, intent)));
    const input = this.right.querySelector("#fork-intent");
    if (typed && input) {
      input.value = typed.value;
      if (focused) input.focus();
    }
  }

  // -- live --------------------------------------------------------------------------

  startLive() {
    this.status = el("div", { class: "status", id: "live-status", text: "connecting…" });
    this.stream = el("pre", { class: "stream", id: "live-stream" });
    // What this page's own prompt ended with (the prompt's response), apart from
    // the event stream's status: the two streams may arrive in either order.
    this.outcome = el("div", { class: "status", id: "live-result" });
    this.prompt = el("textarea", { id: "prompt", placeholder: "send a prompt to this session…", "aria-label": "prompt" });
    this.send = el("button", { class: "primary", id: "send", type: "submit", text: "Send", disabled: true });
    this.cancel = el("button", { class: "danger", id: "cancel", type: "button", text: "Cancel", disabled: true,
      onclick: () => this.cancelCast() });
    // While a cast runs, what is typed here is a message to it (it joins the next turn).
    const form = el("form", { onsubmit: (event) => {
      event.preventDefault();
      if (this.running) this.steerCast(this.prompt.value); else this.sendPrompt(this.prompt.value);
    } }, this.prompt, this.send, this.cancel);
    this.left.append(el("div", { class: "live" }, this.status, this.stream, this.outcome, form));
    this.subscribe();
  }

  async subscribe() {
    try {
      const response = await fetch(`/sessions/${this.sessionId}/events`, {
        headers: authHeaders(), signal: this.abort.signal });
      if (!response.ok) {
        const data = await response.json().catch(() => ({}));
        throw new Error((data.error && data.error.message) || response.statusText);
      }
      await readSSE(response, (name, data) => this.onEvent(name, data), (comment) => {
        if (comment === "subscribed") {
          this.status.textContent = "idle";
          this.send.disabled = false;
          if (pendingPrompt && pendingPrompt.entityId === this.entityId) {
            const text = pendingPrompt.text;
            pendingPrompt = null;
            this.sendPrompt(text);
          }
        }
      });
    } catch (error) {
      if (error.name !== "AbortError") { showError(error); this.status.textContent = "disconnected"; }
    }
  }

  setRunning(running) {
    this.running = running;
    this.cancel.disabled = !running;
    this.send.textContent = running ? "Send to the running cast" : "Send";
    this.prompt.placeholder = running
      ? "a message for the running cast (it joins the next turn)…"
      : "send a prompt to this session…";
    this.renderHead();
  }

  onEvent(name, data) {
    if (data.entity_id && data.entity_id !== this.entityId) {
      if (name === "step_complete") this.tree.refresh().catch(showError);
      return; // a child's streamed text belongs to the child's page
    }
    if (name === "step_start") {
      // One cast's stream stays in the panel until the next cast starts. (The
      // prompt's own response may end before this stream catches up, so the
      // cast's boundaries come from these events, not from the prompt.)
      if (!this.castOpen) this.stream.textContent = "";
      this.castOpen = true;
      this.setRunning(true);
      if (this.stream.textContent) this.stream.append("\n");
      this.stream.append(`— turn ${data.sequence} —\n`);
      this.status.textContent = `turn ${data.sequence}: thinking…`;
    } else if (name === "text_delta") {
      this.stream.append(data.text);
      this.stream.scrollTop = this.stream.scrollHeight;
    } else if (name === "final_response") {
      this.castOpen = false;
      this.setRunning(false);
    } else if (name === "tool_call" && data.final) {
      this.stream.append(`\n→ ${data.name}(${JSON.stringify(data.arguments)})`);
    } else if (name === "tool_result") {
      const record = data.record || {};
      this.stream.append(`\n← ${record.gate}: ${pretty(record.result).slice(0, 500)}`);
    } else if (name === "step_complete") {
      if (data.terminated || data.truncated) { this.castOpen = false; this.setRunning(false); }
      this.status.textContent = `turn ${data.sequence} recorded` + (data.reason ? ` (${data.reason})` : "");
      this.refresh();
    }
  }

  async refresh() {
    try {
      if (!this.tree.total) await this.tree.open(null); else await this.tree.refresh();
      const found = await api("/api/entities?" + new URLSearchParams({ q: this.entityId, limit: 5 }));
      this.summary = found.items.find((e) => e.entity_id === this.entityId) || this.summary;
      this.renderHead();
    } catch (error) { showError(error); }
  }

  async sendPrompt(text) {
    if (!text.trim()) return;
    this.prompt.value = "";
    this.stream.textContent = "";
    this.outcome.textContent = "";
    this.setRunning(true);
    this.status.textContent = "sending…";
    // The prompt's own name from the start: Cancel is live before its answer (and the
    // Prompt-Id it carries) arrives, and a cancel that overtakes the prompt is armed for it.
    this.promptKey = randomKey();
    try {
      const response = await fetch(`/sessions/${this.sessionId}/prompt?stream=1`, {
        method: "POST", signal: this.abort.signal,
        headers: authHeaders({
          "content-type": "application/json", accept: "text/event-stream", "idempotency-key": this.promptKey,
        }),
        body: JSON.stringify({ prompt: text }),
      });
      if (!response.ok) {
        const data = await response.json().catch(() => ({}));
        throw new Error((data.error && data.error.message) || response.statusText);
      }
      await readSSE(response, (name, data) => {
        if (name === "result") this.outcome.textContent = `done: ${data.stop_reason}` + (data.summary ? ` — ${data.summary}` : "");
        if (name === "error") showError(data.error.message);
      });
    } catch (error) {
      if (error.name !== "AbortError") showError(error);
    } finally {
      if (!this.abort.signal.aborted) { this.setRunning(false); this.refresh(); }
    }
  }

  async steerCast(text) {
    if (!text.trim()) return;
    this.prompt.value = "";
    try {
      await postJSON(`/sessions/${this.sessionId}/messages`, { text });
      this.stream.append(`\n✉ ${text}\n`);
      this.status.textContent = "message sent: it joins the next turn";
    } catch (error) { showError(error); }
  }

  async cancelCast() {
    try {
      // Name the prompt this page started last: a late click never stops a later prompt.
      const answer = await postJSON(`/sessions/${this.sessionId}/cancel`, this.promptKey ? { idempotency_key: this.promptKey } : {});
      // The prompt's own answer may already be here; it has the last word.
      const requested = answer.cancelled || answer.target === "next"; // "next": armed for it
      if (!this.outcome.textContent) this.outcome.textContent = requested ? "cancel requested" : "nothing to cancel";
    } catch (error) { showError(error); }
  }
}

let pendingPrompt = null;

/** A random idempotency key (crypto.getRandomValues works outside secure contexts too). */
function randomKey() {
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

async function forkFrom(turnId, intent) {
  try {
    const session = await postJSON("/api/fork", { turn_id: turnId });
    pendingPrompt = { entityId: session.entity_id, text: intent };
    location.hash = "#/e/" + session.entity_id;
  } catch (error) { showError(error); }
}

// Names a part of a turn's panel as the server names what differs (compare marks it).
function field(node, name) { node.dataset.field = name; return node; }

function renderTurn(turn, onFork) {
  const meta = turn.metadata || {};
  const box = el("div", { class: "turn", id: "turn", dataset: { turn: turn.id } });
  box.append(el("h2", {}, `Turn ${turn.sequence} `, badge(turn.status),
    turn.reason ? el("span", { class: "muted", text: " " + turn.reason }) : null,
    turn.ephemeral ? badge("ephemeral") : null,
    turn.extras && turn.extras.phase ? badge("delegating", turn.extras.phase) : null));
  box.append(el("div", { class: "meta" },
    el("span", { class: "mono", text: turn.id }),
    el("a", { href: "#/e/" + turn.entity_id, text: turn.entity_id }),
    el("span", { text: `tokens ${meta.tokens_prompt || 0} prompt / ${meta.tokens_completion || 0} completion / ${meta.tokens_cached || 0} cached` }),
    el("span", { text: `${(meta.duration_ms || 0).toFixed(1)} ms` }),
    el("span", { class: "cost", text: cost(turn.cost) }),
    meta.model ? el("span", { text: meta.model }) : null,
    meta.attempts && meta.attempts !== 1 ? el("span", { text: `${meta.attempts} attempts` }) : null,
    el("span", { text: when(meta.timestamp) }),
    turn.reward !== null && turn.reward !== undefined ? el("span", { text: "reward " + turn.reward }) : null));

  const actions = el("div", { class: "actions" },
    el("a", { href: "#/thread/" + turn.id }, el("button", { id: "open-thread", text: "Thread as chat" })));
  if (state.live) {
    const input = el("input", { id: "fork-intent", "data-turn": turn.id, placeholder: "a new intent from this turn…", "aria-label": "fork intent" });
    const form = el("form", { class: "forkform", onsubmit: (event) => {
      event.preventDefault();
      if (input.value.trim()) onFork(turn.id, input.value);
    } }, input, el("button", { id: "fork", type: "submit", text: "Fork from this turn" }));
    actions.append(form);
  }
  box.append(actions);

  if (turn.intent) box.append(el("section", { dataset: { field: "request" } }, el("h3", { text: "intent" }), longText(turn.intent)));
  const steering = (turn.extras && turn.extras.steering) || [];
  if (steering.length) {
    box.append(el("section", { id: "steering", dataset: { field: "request" } }, el("h3", { text: "messages sent during the cast" }),
      steering.map((text) => longText(text, "steering"))));
  }
  const memory = turn.extras && turn.extras.memory;
  if (memory && memory.text) {
    // What memory added to this cast's prompt (recorded, so a replay sees the same); each
    // recalled item opens on the memory page (memory.js).
    box.append(el("section", { id: "turn-memory", dataset: { field: "request" } }, el("h3", { text: "memory in this prompt" }),
      longText(memory.text),
      (memory.recalled || []).map((r) => el("a", { class: "recalled", href: memoryHash("/item", { namespace: JSON.stringify(r.namespace), key: r.key }),
        text: `${r.namespace.join("/")} ${r.key} (r${r.revision})` })).flatMap((link) => [link, " "])));
  }
  if (turn.thinking) {
    box.append(el("section", {}, el("details", {}, el("summary", { text: "thinking" }), longText(turn.thinking))));
  }
  const codeCall = (turn.tool_calls || []).find((c) => c.arguments && typeof c.arguments.code === "string");
  if (turn.medium !== "conversation" && codeCall) {
    if (turn.content) box.append(el("section", { dataset: { field: "utterance" } }, el("h3", { text: "text" }), longText(turn.content)));
    box.append(el("section", { dataset: { field: "utterance" } }, el("h3", { text: "code" }), highlight(codeCall.arguments.code)));
  } else if (turn.content || turn.utterance) {
    box.append(el("section", { dataset: { field: "utterance" } }, el("h3", { text: "utterance" }), longText(turn.content || turn.utterance)));
  }
  if ((turn.gate_calls || []).length) {
    const calls = turn.gate_calls.map((r, index) => {
      const failed = r.is_error || r.status === "error" || r.status === "crashed";
      return el("div", { class: "call" + (failed ? " error" : ""), dataset: { gate: r.gate, field: `gate_calls[${index}]` } },
        el("div", {}, el("span", { class: "name", text: r.gate }), " ",
          r.status !== "ok" ? badge(r.status) : null,
          r.detail && r.detail.ephemeral ? badge("ephemeral") : null,
          r.detail && r.detail.truncated ? badge("truncated") : null,
          r.detail && r.detail.result_cut ? resultCut(r.detail.result_cut) : null,
          el("span", { class: "muted", text: ` ${(r.duration_ms || 0).toFixed(1)} ms` })),
        el("div", { class: "muted", text: "arguments" }), field(longText(pretty(r.args), "args"), `gate_calls[${index}].args`),
        el("div", { class: "muted", text: failed ? "error" : "result" }), field(longText(pretty(r.result), "result"), `gate_calls[${index}].result`));
    });
    box.append(el("section", {}, el("h3", { text: "gate calls" }), calls));
  }
  if (turn.observation) box.append(el("section", { dataset: { field: "observation" } }, el("h3", { text: "observation" }), longText(turn.observation)));
  if (turn.terminated) box.append(el("section", { dataset: { field: "outcome" } }, el("h3", { text: "result" }), longText(pretty(turn.result))));
  if ((turn.branches || []).some((b) => b.branch !== "next")) {
    box.append(el("section", {}, el("h3", { text: "branches from here" }),
      turn.branches.filter((b) => b.branch !== "next").map((b) =>
        el("div", {}, badge(b.branch), " ", el("a", { href: `#/e/${b.entity_id}/t/${b.id}`, text: b.entity_id }), " ",
          el("a", { class: "compare-link", href: `#/compare/${turn.entity_id}/${b.entity_id === turn.entity_id ? b.id : b.entity_id}`, text: "compare" })))));
  }
  return box;
}

// -- a thread as a chat transcript -------------------------------------------------

class ThreadPage {
  constructor(main, turnId) {
    this.turnId = turnId;
    this.offset = 0;
    this.box = el("div", { class: "transcript", id: "transcript" });
    this.more = el("button", { text: "load more", onclick: () => this.load() });
    main.append(el("div", { class: "entity-head" }, el("span", { class: "muted", text: "thread to " }),
      el("span", { class: "mono", text: turnId })), this.box);
    this.load();
  }

  async load() {
    let page;
    try {
      page = await api(`/api/threads/${encodeURIComponent(this.turnId)}?` + new URLSearchParams({ offset: this.offset, limit: THREAD_PAGE }));
    } catch (error) { showError(error); return; }
    this.more.remove();
    for (const m of page.messages) this.box.append(message(m));
    this.offset = page.offset + THREAD_PAGE;
    if (this.offset < page.total) this.box.append(this.more);
  }
}

function message(m) {
  const link = el("a", { href: `#/e/${m.entity_id}/t/${m.turn_id}`, text: `turn ${m.sequence}` });
  if (m.role === "user") return el("div", { class: "msg user" }, el("div", { class: "who" }, "intent · ", link), el("div", { class: "text", text: m.text }));
  if (m.role === "tool") {
    return el("div", { class: "msg tool" + (m.is_error ? " error" : "") },
      el("div", { class: "who" }, `${m.gate}(${JSON.stringify(m.args)})`, m.status !== "ok" ? [" ", badge(m.status)] : null),
      el("div", { class: "text", text: m.text.length > 4000 ? m.text.slice(0, 4000) + "…" : m.text }));
  }
  if (m.role === "outcome") {
    return el("div", { class: "msg outcome " + m.status }, el("div", { class: "who" }, badge(m.status), " ", m.reason || ""),
      m.result !== null && m.result !== undefined ? el("div", { class: "text", text: pretty(m.result) }) : null);
  }
  return el("div", { class: "msg assistant" }, el("div", { class: "who" }, "entity · ", link),
    m.thinking ? el("details", {}, el("summary", { text: "thinking" }), el("div", { class: "text", text: m.thinking })) : null,
    el("div", { class: "text", text: m.text || "" }));
}

start();
