// Eval runs (#/evals): the runs `cantrip eval --loom` recorded, with pass/fail per run;
// a run (#/evals/RUN) lists its cases with pass/fail per case, filterable by status and
// name; a case opens its cast's timeline (#/e/ENTITY/timeline); two cases picked open
// Compare on their casts; two runs picked (#/evals/A/vs/B) pair their cases by name and
// repeat, each pair opening Compare (#/compare/CAST_A/CAST_B).
//
// Read a page at a time from /api/evals, /api/evals/{run}, /api/evals/{a}/vs/{b}: the
// server reads the runs' records, never the casts' turns. Loaded before app.js, whose
// helpers (el, api, badge, cost, when, showError, LIST_PAGE) it uses.
"use strict";

const EVAL_STATUSES = ["passed", "failed", "errored", "skipped"];

function evalCounts(counts) {
  return el("span", { class: "eval-counts" }, ...EVAL_STATUSES
    .filter((s) => counts[s] || s === "passed" || s === "failed")
    .map((s) => badge(s, `${counts[s] || 0} ${s}`)));
}

function evalPager(page, noun, go) {
  const last = Math.min(page.offset + page.items.length, page.total);
  return el("div", { class: "pager" },
    el("button", { text: "‹ prev", disabled: page.offset === 0, onclick: () => go(Math.max(0, page.offset - page.limit)) }),
    el("span", { class: "muted", text: page.total ? `${page.offset + 1}–${last} of ${page.total}` : `no ${noun}` }),
    el("button", { text: "next ›", disabled: last >= page.total, onclick: () => go(page.offset + page.limit) }));
}

function evalTable(cls, headings, rows) {
  return el("table", { class: "entities " + cls },
    el("thead", {}, el("tr", {}, ...headings.map((h) => el("th", { text: h })))),
    el("tbody", {}, rows));
}

// A checkbox that picks a row for a pair (clicking it does not open the row).
function pickBox(picked, key, onChange) {
  const box = el("input", { type: "checkbox", class: "pick", "aria-label": "pick " + key,
    onclick: (event) => event.stopPropagation(),
    onchange: () => { if (box.checked) picked.add(key); else picked.delete(key); onChange(); } });
  box.checked = picked.has(key);
  return box;
}

class EvalRunsPage {
  constructor(main) {
    this.offset = 0;
    this.picked = new Set();
    this.compare = el("button", { id: "compare-runs", class: "primary", disabled: true,
      text: "Compare two runs", onclick: () => {
        const [a, b] = [...this.picked];
        location.hash = `#/evals/${a}/vs/${b}`;
      } });
    this.hint = el("span", { class: "muted", text: "pick two runs to compare them case by case" });
    this.body = el("div", { class: "list" });
    main.append(el("div", { class: "toolbar" }, el("strong", { text: "Eval runs" }), this.compare, this.hint), this.body);
    this.load();
  }

  picking() { this.compare.disabled = this.picked.size !== 2; }

  async load() {
    let page;
    try { page = await api(`/api/evals?offset=${this.offset}&limit=${LIST_PAGE}`); } catch (error) { showError(error); return; }
    const rows = page.items.map((r) => el("tr", {
      class: "entity eval-run", dataset: { run: r.run_id },
      onclick: () => { location.hash = "#/evals/" + r.run_id; },
    },
      el("td", {}, pickBox(this.picked, r.run_id, () => this.picking())),
      el("td", { class: "mono", text: r.run_id }),
      el("td", { text: r.suite || "" }),
      el("td", {}, evalCounts(r)),
      el("td", { text: r.mode || "" }),
      el("td", { text: String(r.summary.tokens) }),
      el("td", { text: cost(r.summary.cost_usd) }),
      el("td", { text: when(r.started) }),
    ));
    this.body.replaceChildren(
      evalTable("eval-runs", ["", "run", "suite", "cases", "mode", "tokens", "cost", "started"], rows),
      evalPager(page, "eval runs in this loom (record some with cantrip eval --loom FILE)", (offset) => { this.offset = offset; this.load(); }));
  }
}

class EvalRunPage {
  constructor(main, runId) {
    this.runId = runId;
    this.offset = 0;
    this.picked = new Set();
    this.head = el("div", { class: "entity-head", id: "eval-head" });
    this.status = el("select", { id: "eval-status", "aria-label": "status",
      onchange: () => { this.offset = 0; this.load(); } },
      el("option", { value: "", text: "every status" }),
      el("option", { value: "failed,errored", text: "not passed" }),
      ...EVAL_STATUSES.map((s) => el("option", { value: s, text: s })));
    this.name = el("input", { type: "search", id: "eval-name", placeholder: "case name…", "aria-label": "case name" });
    let timer = null;
    this.name.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => { this.offset = 0; this.load(); }, 200);
    });
    this.compare = el("button", { id: "compare-cases", class: "primary", disabled: true,
      text: "Compare two casts", onclick: () => {
        const [a, b] = [...this.picked];
        location.hash = `#/compare/${a}/${b}`;
      } });
    this.body = el("div", { class: "list" });
    main.append(this.head, el("div", { class: "toolbar" }, this.status, this.name, this.compare), this.body);
    this.load();
  }

  async load() {
    const params = new URLSearchParams({ offset: this.offset, limit: LIST_PAGE });
    if (this.status.value) params.set("status", this.status.value);
    if (this.name.value.trim()) params.set("name", this.name.value.trim());
    let page;
    try { page = await api(`/api/evals/${encodeURIComponent(this.runId)}?${params}`); } catch (error) { showError(error); return; }
    const run = page.run;
    this.head.replaceChildren(
      el("a", { href: "#/evals", text: "eval runs" }), el("span", { class: "muted", text: "›" }),
      el("span", { class: "id mono", text: run.run_id }),
      el("span", { class: "muted", text: `${run.suite || ""} · ${run.mode || ""} · ${when(run.started)}` }),
      evalCounts(page.counts));
    const rows = page.items.map((c) => el("tr", {
      class: "entity eval-case " + c.status, dataset: { status: c.status, case: c.name, entity: c.entity_id || "" },
      onclick: () => { if (c.entity_id) location.hash = `#/e/${c.entity_id}/timeline`; },
    },
      el("td", {}, c.entity_id ? pickBox(this.picked, c.entity_id, () => { this.compare.disabled = this.picked.size !== 2; }) : null),
      el("td", {}, badge(c.status)),
      el("td", { text: c.name }),
      el("td", { text: String(c.repeat + 1) }),
      el("td", { class: "intent" }, c.reason ? el("span", { class: "mono", text: c.reason }) : null,
        c.why ? el("div", { class: "muted eval-why", text: c.why }) : null),
      el("td", { text: String(c.turns) }),
      el("td", { text: String(c.tokens) }),
      el("td", { text: cost(c.cost_usd) }),
      el("td", { class: "mono muted", text: c.entity_id || "no cast" }),
    ));
    this.body.replaceChildren(
      evalTable("eval-cases", ["", "status", "case", "#", "ending / why", "turns", "tokens", "cost", "cast"], rows),
      evalPager(page, "cases match", (offset) => { this.offset = offset; this.load(); }));
  }
}

class EvalPairsPage {
  constructor(main, a, b) {
    this.a = a;
    this.b = b;
    this.offset = 0;
    this.head = el("div", { class: "entity-head", id: "eval-pairs-head" });
    this.changed = el("input", { type: "checkbox", id: "eval-changed", onchange: () => { this.offset = 0; this.load(); } });
    this.body = el("div", { class: "list" });
    main.append(this.head,
      el("div", { class: "toolbar" }, el("label", {}, this.changed, " only cases whose verdict changed")),
      this.body);
    this.load();
  }

  async load() {
    const params = new URLSearchParams({ offset: this.offset, limit: LIST_PAGE });
    if (this.changed.checked) params.set("changed", "1");
    let page;
    try {
      page = await api(`/api/evals/${encodeURIComponent(this.a)}/vs/${encodeURIComponent(this.b)}?${params}`);
    } catch (error) { showError(error); return; }
    this.head.replaceChildren(
      el("a", { href: "#/evals", text: "eval runs" }), el("span", { class: "muted", text: "›" }),
      el("a", { class: "mono", href: "#/evals/" + page.a.run_id, text: "A " + page.a.run_id }), evalCounts(page.a),
      el("span", { class: "muted", text: "vs" }),
      el("a", { class: "mono", href: "#/evals/" + page.b.run_id, text: "B " + page.b.run_id }), evalCounts(page.b),
      el("span", { id: "eval-changed-count", text: `${page.changed} case${page.changed === 1 ? "" : "s"} changed` }));
    const side = (c) => c ? badge(c.status) : el("span", { class: "muted", text: "not run" });
    const rows = page.items.map((p) => {
      const both = p.a && p.b && p.a.entity_id && p.b.entity_id;
      const open = () => { if (both) location.hash = `#/compare/${p.a.entity_id}/${p.b.entity_id}`; };
      return el("tr", { class: "entity eval-pair" + (p.changed ? " changed" : ""), dataset: { case: p.name }, onclick: open },
        el("td", { text: p.name }),
        el("td", { text: String(p.repeat + 1) }),
        el("td", {}, side(p.a)),
        el("td", {}, side(p.b)),
        el("td", {}, both ? el("a", { class: "compare-cast", href: `#/compare/${p.a.entity_id}/${p.b.entity_id}`, text: "compare casts",
          onclick: (event) => event.stopPropagation() }) : null));
    });
    this.body.replaceChildren(
      evalTable("eval-pairs", ["case", "#", "A", "B", ""], rows),
      evalPager(page, "cases", (offset) => { this.offset = offset; this.load(); }));
  }
}

// The routes app.js hands here: true when the hash was an eval page.
function evalRoute(hash, main) {
  let match;
  if (hash === "/evals") return new EvalRunsPage(main);
  if ((match = hash.match(/^\/evals\/([^/]+)\/vs\/([^/]+)$/))) return new EvalPairsPage(main, match[1], match[2]);
  if ((match = hash.match(/^\/evals\/([^/]+)$/))) return new EvalRunPage(main, match[1]);
  return null;
}
