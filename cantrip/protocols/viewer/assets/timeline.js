// The timeline of a cast (#/e/ENTITY/timeline): a waterfall of the entity and every
// entity it spawned -- one row per entity, children under the parent that spawned them,
// one bar per turn split into waiting for a human, model time and gate time.
//
// Loaded before app.js, whose helpers (el, api, badge, cost, ...) it uses once the page
// runs. Rows are read a page at a time and only the rows on screen exist (as the tree);
// each page carries, for its rows, the bars inside the visible time window at the
// resolution of one pixel (/api/entities/ID/timeline?from=&to=&width=): turns narrower than a
// pixel come as one group bar, which a click zooms into. Live (under `cantrip serve`), the
// session's event stream reloads the loaded rows as turns land.
"use strict";

const TL_ROW = 30;
const TL_PAGE = 100;
const TL_LABEL = 230;

class TimelinePage {
  constructor(main, entityId) {
    this.entityId = entityId;
    this.abort = new AbortController();
    this.pages = new Map();
    this.loading = new Set();
    this.total = 0;
    this.span = 0;
    this.window = null; // [from, to] in ms; null: the whole cast, following it as it grows
    this.generation = 0;
    this.painted = false;
    this.head = el("div", { class: "entity-head" },
      el("a", { class: "id mono", href: "#/e/" + entityId, text: entityId }),
      el("span", { class: "muted", text: "timeline" }));
    const zoom = (factor) => () => this.zoom(factor);
    this.toolbar = el("div", { class: "toolbar tl-toolbar" },
      el("button", { id: "tl-zoom-in", text: "+", title: "zoom in", onclick: zoom(0.5) }),
      el("button", { id: "tl-zoom-out", text: "−", title: "zoom out", onclick: zoom(2) }),
      el("button", { id: "tl-fit", text: "fit", title: "the whole cast", onclick: () => this.setWindow(null) }),
      el("button", { text: "‹", title: "earlier", onclick: () => this.pan(-0.5) }),
      el("button", { text: "›", title: "later", onclick: () => this.pan(0.5) }),
      el("span", { class: "tl-legend" },
        el("span", { class: "seg wait" }), "waiting for a human ",
        el("span", { class: "seg model" }), "model ",
        el("span", { class: "seg gate" }), "gates ",
        ...["terminated", "truncated", "cancelled", "failed", "paused", "error"].map((s) =>
          el("span", { class: "tl-key bar s-" + s, text: s }))),
      el("span", { class: "muted", id: "tl-range" }));
    this.axis = el("div", { class: "tl-axis", id: "tl-axis" });
    this.spacer = el("div", { class: "spacer" });
    this.box = el("div", { class: "tl-rows", id: "timeline" }, this.spacer);
    this.right = el("div", { class: "right", id: "detail" },
      el("p", { class: "muted", text: "click a bar to see its turn; a bar of several turns zooms in" }));
    const left = el("div", { class: "left tl-left" }, this.toolbar, this.axis, this.box);
    main.append(this.head, el("div", { class: "split" }, left, this.right));
    this.frame = 0;
    this.box.addEventListener("scroll", () => this.schedule());
    this.resize = () => this.reload();
    window.addEventListener("resize", this.resize);
    this.open();
  }

  close() {
    this.abort.abort();
    window.removeEventListener("resize", this.resize);
  }

  trackWidth() { return Math.max(100, this.box.clientWidth - TL_LABEL - 12); }

  bounds() { return this.window || [0, Math.max(this.span, 1)]; }

  async open() {
    try { await this.fetchPage(0); } catch (error) { showError(error); return; }
    this.spacer.style.height = this.total * TL_ROW + "px";
    this.render();
    const root = this.pages.get(0) && this.pages.get(0)[0];
    if (state.live && root && !root.parent_entity_id) this.follow();
  }

  async fetchPage(number) {
    const generation = this.generation;
    const [from, to] = this.bounds();
    const params = new URLSearchParams({ offset: number * TL_PAGE, limit: TL_PAGE });
    if (this.window) { params.set("from", from); params.set("to", to); }
    params.set("width", this.trackWidth()); // the server knows the span: it makes the pixel
    const page = await api(`/api/entities/${encodeURIComponent(this.entityId)}/timeline?` + params);
    if (generation !== this.generation) return; // the window changed meanwhile
    this.total = page.total;
    this.span = page.span_ms;
    this.shown = [page.from, page.to];
    this.pages.set(number, page.items);
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => { this.frame = 0; this.render(); });
  }

  load(number) {
    if (this.loading.has(number)) return;
    this.loading.add(number);
    this.fetchPage(number).then(() => this.render()).catch(showError)
      .finally(() => this.loading.delete(number));
  }

  // Every loaded page again, at the current window (a zoom, a pan, new turns).
  async reload() {
    this.generation += 1;
    const numbers = [...this.pages.keys()];
    this.pages.clear();
    try {
      for (const number of numbers.length ? numbers : [0]) await this.fetchPage(number);
    } catch (error) { showError(error); return; }
    this.spacer.style.height = this.total * TL_ROW + "px";
    this.render();
  }

  setWindow(range) {
    this.window = range;
    this.reload();
  }

  zoom(factor) {
    const [from, to] = this.bounds();
    const middle = (from + to) / 2;
    const half = Math.max((to - from) * factor / 2, 0.5);
    this.setWindow([Math.max(0, middle - half), middle + half]);
  }

  pan(fraction) {
    const [from, to] = this.bounds();
    const shift = (to - from) * fraction;
    const start = Math.max(0, from + shift);
    this.setWindow([start, start + (to - from)]);
  }

  render() {
    const top = this.box.scrollTop;
    const height = this.box.clientHeight || 600;
    const first = Math.max(0, Math.floor(top / TL_ROW) - 5);
    const last = Math.min(this.total, Math.ceil((top + height) / TL_ROW) + 5);
    const [from, to] = this.shown || this.bounds();
    const scale = this.trackWidth() / Math.max(to - from, 1e-3);
    const rows = [];
    for (let index = first; index < last; index++) {
      const page = this.pages.get(Math.floor(index / TL_PAGE));
      const item = page && page[index % TL_PAGE];
      if (!item) {
        this.load(Math.floor(index / TL_PAGE));
        rows.push(el("div", { class: "tl-row placeholder", style: { top: index * TL_ROW + "px" }, text: "…" }));
        continue;
      }
      rows.push(this.row(item, index, from, scale));
    }
    this.spacer.replaceChildren(...rows);
    this.renderAxis(from, to, scale);
    document.getElementById("tl-range").textContent = `${duration(from)} – ${duration(to)} of ${duration(this.span)}`;
    if (!this.painted && rows.some((r) => r.querySelector(".bar"))) {
      this.painted = true;
      requestAnimationFrame(() => performance.mark("cantrip-timeline-painted"));
    }
  }

  renderHead(root) {
    if (!root) return;
    this.head.replaceChildren(
      el("a", { class: "id mono", href: "#/e/" + this.entityId, text: this.entityId }),
      badge(root.status),
      el("span", { class: "muted", text: `timeline · ${this.total} entities · ${duration(this.span)}` }));
  }

  row(item, index, from, scale) {
    if (index === 0) this.renderHead(item);
    const label = el("div", { class: "tl-label", style: { paddingLeft: 6 + item.depth * 14 + "px" },
      title: item.spawned_from ? `spawned by turn ${item.spawned_from}` : item.entity_id },
      item.depth ? el("span", { class: "muted", text: "↳ " }) : null,
      el("a", { class: "mono", href: "#/e/" + item.entity_id, text: item.entity_id }), " ",
      badge(item.status),
      el("div", { class: "muted tl-totals", text: `${item.turns} turns · ${item.tokens} tok · ${cost(item.cost_usd)}` }));
    const track = el("div", { class: "tl-track" }, item.bars.map((bar) => this.bar(item, bar, from, scale)));
    return el("div", {
      class: "tl-row", style: { top: index * TL_ROW + "px" },
      dataset: { entity: item.entity_id, depth: String(item.depth) },
    }, label, track);
  }

  bar(row, bar, from, scale) {
    const width = Math.max(2, (bar.end_ms - bar.start_ms) * scale);
    const group = bar.turns > 1;
    const segments = [];
    const total = Math.max(bar.wait_ms + bar.model_ms + bar.gate_ms, 1e-6);
    // A bar a few pixels wide shows no split (the tooltip has it): fewer nodes to build.
    const parts = width >= 8 ? [["wait", bar.wait_ms], ["model", bar.model_ms], ["gate", bar.gate_ms]] : [];
    for (const [kind, ms] of parts) {
      if (ms > 0) segments.push(el("span", { class: "seg " + kind, style: { width: (100 * ms / total) + "%" } }));
    }
    const what = group ? `${bar.turns} turns #${bar.sequence}–#${bar.last_sequence}` : `turn #${bar.sequence}`;
    const counts = group ? " (" + Object.entries(bar.statuses).map(([s, n]) => `${n} ${s}`).join(", ") + ")" : "";
    const title = `${what} · ${bar.status}${bar.reason ? " (" + bar.reason + ")" : ""}${counts}\n` +
      `model ${duration(bar.model_ms)} · gates ${duration(bar.gate_ms)}` +
      (bar.wait_ms ? ` · waiting for a human ${duration(bar.wait_ms)}` : "") +
      `\n${bar.tokens} tokens · ${cost(bar.cost_usd)}`;
    const text = width >= 90 ? `${group ? bar.turns + "× " : "#" + bar.sequence} ${cost(bar.cost_usd)} · ${bar.tokens} tok` : "";
    return el("div", {
      class: `bar s-${bar.status}` + (group ? " group" : "") + (bar.id === this.selected ? " selected" : ""),
      style: { left: (bar.start_ms - from) * scale + "px", width: width + "px" },
      dataset: { turn: bar.id, status: bar.status, turns: String(bar.turns), tokens: String(bar.tokens),
        cost: bar.cost_usd === null ? "unknown" : String(bar.cost_usd) },
      title,
      onclick: () => group ? this.setWindow([bar.start_ms, Math.max(bar.end_ms, bar.start_ms + 1)]) : this.select(row, bar.id),
    }, segments, text ? el("span", { class: "bar-text", text }) : null);
  }

  renderAxis(from, to, scale) {
    const target = (to - from) / Math.max(1, this.trackWidth() / 110);
    const power = Math.pow(10, Math.floor(Math.log10(Math.max(target, 1e-3))));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= target) || power * 10;
    const ticks = [];
    for (let t = Math.ceil(from / step) * step; t <= to; t += step) {
      ticks.push(el("span", { class: "tick", style: { left: TL_LABEL + (t - from) * scale + "px" }, text: duration(t) }));
    }
    this.axis.replaceChildren(...ticks);
  }

  async select(row, turnId) {
    this.selected = turnId;
    this.render();
    let turn;
    try { turn = await api("/api/turns/" + encodeURIComponent(turnId)); } catch (error) { showError(error); return; }
    this.right.replaceChildren(renderTurn(turn, (id, intent) => forkFrom(id, intent)));
  }

  // Live: the root session's events; a recorded turn (its own or a child's) reloads.
  async follow() {
    let timer = null;
    const later = () => { clearTimeout(timer); timer = setTimeout(() => this.reload(), 150); };
    try {
      const response = await fetch(`/sessions/${sessionOf(this.entityId)}/events`, {
        headers: authHeaders(), signal: this.abort.signal });
      if (!response.ok) return; // not a session (a loom file's entity): nothing to follow
      await readSSE(response, (name) => { if (name === "step_complete") later(); }, (comment) => {
        if (comment === "subscribed") this.box.dataset.following = "live";
      });
    } catch (error) {
      if (error.name !== "AbortError") showError(error);
    }
  }
}

function duration(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1) return ms.toFixed(2) + " ms";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  return Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
}
