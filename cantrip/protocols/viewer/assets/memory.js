// Memory (#/memory?namespace=&q=): the items of the loom's memory store, under a
// namespace and searched, a page at a time, with the namespaces that hold items; an item
// (#/memory/item?namespace=&key=) shows its value, its revisions, the turn that wrote it
// and -- for a consolidated item -- the turns it was drawn from, each a link to that
// turn in its entity's tree (#/e/ENTITY/t/TURN).
//
// Read from /api/memory/namespaces, /api/memory/items and /api/memory/item. These pages
// keep their state in the query part of the hash, which is read undecoded (a namespace
// part or a key may hold "/"). Loaded before app.js, whose helpers (el, api, badge, when,
// pretty, longText, showError, LIST_PAGE) it uses.
"use strict";

function memoryHash(path, params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) if (value) query.set(name, value);
  const text = query.toString();
  return "#/memory" + path + (text ? "?" + text : "");
}

function turnLink(source, cls) {
  if (!source || !source.turn_id) return el("span", { class: "muted", text: "written by code" });
  const href = `#/e/${encodeURIComponent(source.entity_id || "")}/t/${encodeURIComponent(source.turn_id)}`;
  return el("a", { class: cls || "turn-link", href, title: source.entity_id || "", text: source.turn_id,
    onclick: (event) => event.stopPropagation() });
}

// A turn the loom still holds, as the server summarised it; or why there is none.
function turnSummary(source, turn) {
  if (!source || !source.turn_id) return el("div", { class: "muted", text: "written by code (no turn)" });
  const named = turn ? turnLink(source) : el("span", { class: "mono", text: source.turn_id }); // no page to open
  const head = el("div", {}, named, " ",
    el("span", { class: "muted", text: source.entity_id ? `${source.entity_id}` : "" }),
    turn ? el("span", { class: "muted", text: ` · turn ${turn.sequence}` }) : [" ", badge("gone", "not in this loom")]);
  if (!turn) return el("div", { class: "memory-turn gone" }, head);
  return el("div", { class: "memory-turn" }, head,
    turn.intent ? el("div", { class: "intent" }, el("span", { class: "muted", text: "intent: " }), turn.intent) : null,
    turn.utterance ? el("div", { class: "muted", text: turn.utterance }) : null);
}

class MemoryPage {
  constructor(main, params) {
    this.offset = 0;
    this.namespace = el("input", { type: "search", id: "memory-namespace", value: params.get("namespace") || "",
      placeholder: "namespace, e.g. user/alice", "aria-label": "namespace" });
    this.query = el("input", { type: "search", id: "memory-query", value: params.get("q") || "",
      placeholder: "search memories…", "aria-label": "search memories" });
    this.mode = el("select", { id: "memory-mode", "aria-label": "search mode", hidden: true },
      ...["", "text", "semantic", "hybrid"].map((m) => el("option", { value: m, text: m || "default search" })));
    let timer = null;
    const changed = () => {
      clearTimeout(timer);
      timer = setTimeout(() => { this.offset = 0; this.load(); }, 250);
    };
    this.namespace.addEventListener("input", changed);
    this.query.addEventListener("input", changed);
    this.mode.addEventListener("change", changed);
    this.spaces = el("div", { class: "memory-spaces", id: "memory-namespaces" });
    this.body = el("div", { class: "list memory-list", id: "memory-items" });
    main.append(el("div", { class: "toolbar" }, el("strong", { text: "Memory" }), this.namespace, this.query, this.mode),
      el("div", { class: "memory-split" }, this.spaces, this.body));
    this.load();
  }

  async load() {
    const namespace = this.namespace.value.trim();
    const q = this.query.value.trim();
    history.replaceState(null, "", memoryHash("", { namespace, q }));
    showError(null);
    this.loadSpaces(namespace);
    const params = new URLSearchParams({ namespace, offset: this.offset, limit: LIST_PAGE });
    if (q) params.set("q", q);
    if (this.mode.value) params.set("mode", this.mode.value);
    let page;
    try { page = await api("/api/memory/items?" + params); } catch (error) { this.failed(error); return; }
    if (namespace !== this.namespace.value.trim() || q !== this.query.value.trim()) return; // typed on
    const rows = page.items.map((m) => {
      const ns = m.namespace.join("/");
      return el("tr", { class: "entity memory-item", dataset: { namespace: ns, key: m.key },
        onclick: () => { location.hash = memoryHash("/item", { namespace: JSON.stringify(m.namespace), key: m.key }); } },
        el("td", { class: "mono", text: ns }),
        el("td", { class: "mono", text: m.key }),
        el("td", { class: "intent memory-value", text: m.value }),
        el("td", { text: "r" + m.revision }),
        el("td", {}, turnLink(m.source, "memory-source"),
          m.drawn_from && m.drawn_from.length ? el("div", {}, badge("consolidated", `drawn from ${m.drawn_from.length} turn${m.drawn_from.length === 1 ? "" : "s"}`)) : null),
        el("td", { text: m.score === null || m.score === undefined ? "" : Number(m.score).toFixed(3) }),
        el("td", { text: when(m.updated_at) }));
    });
    const table = el("table", { class: "entities memory-items" },
      el("thead", {}, el("tr", {}, ...["namespace", "key", "value", "rev", "written by", q ? "score" : "", "updated"]
        .map((h) => el("th", { text: h })))),
      el("tbody", {}, rows));
    const pager = el("div", { class: "pager" },
      el("button", { text: "‹ prev", disabled: page.offset === 0,
        onclick: () => { this.offset = Math.max(0, this.offset - LIST_PAGE); this.load(); } }),
      el("span", { class: "muted", text: page.items.length ? `${page.offset + 1}–${page.offset + page.items.length}` : (q ? "no memory matches" : "no memories here") }),
      el("button", { text: "next ›", disabled: !page.more,
        onclick: () => { this.offset += LIST_PAGE; this.load(); } }));
    this.body.replaceChildren(table, pager);
  }

  async loadSpaces(prefix) {
    // The namespaces under what is typed, or all of them when it is not a namespace yet.
    let found;
    try { found = await api("/api/memory/namespaces?" + new URLSearchParams({ prefix, limit: 200 })); }
    catch (error) { if (error.code !== "no_memory") this.spaces.replaceChildren(); return; }
    this.mode.hidden = !found.semantic;
    this.spaces.replaceChildren(el("div", { class: "muted", text: found.namespaces.length ? "namespaces" : "no namespaces" }),
      ...found.namespaces.map((ns) => el("a", { class: "memory-ns", href: memoryHash("", { namespace: ns }), text: ns,
        onclick: (event) => { event.preventDefault(); this.namespace.value = ns; this.offset = 0; this.load(); } })));
  }

  failed(error) {
    if (error.code === "no_memory") {
      this.body.replaceChildren(el("p", { class: "empty muted", id: "memory-none", text: error.message }));
      return;
    }
    showError(error);
    this.body.replaceChildren(el("p", { class: "empty muted", text: "nothing shown: " + error.message }));
  }
}

class MemoryItemPage {
  constructor(main, namespace, key) {
    this.box = el("div", { class: "turn memory-detail", id: "memory-item" });
    main.append(el("div", { class: "right memory-page" }, this.box));
    this.load(namespace, key);
  }

  async load(namespace, key) {
    let item;
    try { item = await api("/api/memory/item?" + new URLSearchParams({ namespace, key })); }
    catch (error) { showError(error); this.box.replaceChildren(el("p", { class: "muted", text: "no item shown" })); return; }
    const ns = item.namespace.join("/");
    const parts = [
      el("div", { class: "meta" },
        el("a", { href: memoryHash("", {}), text: "memory" }), el("span", { class: "muted", text: "›" }),
        el("a", { href: memoryHash("", { namespace: ns }), class: "mono", text: ns })),
      el("h2", {}, el("span", { class: "mono", text: item.key }), " ", badge("rev", "revision " + item.revision),
        item.drawn_from_total ? [" ", badge("consolidated")] : null),
      el("div", { class: "meta" }, el("span", { text: "created " + when(item.created_at) }),
        el("span", { text: "updated " + when(item.updated_at) })),
      el("section", {}, el("h3", { text: "value" }), longText(pretty(item.value), "memory-value")),
      el("section", { id: "memory-source" }, el("h3", { text: "written by" }), turnSummary(item.source, item.source_turn)),
    ];
    if (item.drawn_from_total) {
      const more = item.drawn_from_total - item.drawn_from.length;
      parts.push(el("section", { id: "memory-drawn" },
        el("h3", { text: `drawn from ${item.drawn_from_total} turn${item.drawn_from_total === 1 ? "" : "s"}` }),
        item.drawn_from.map((d) => turnSummary(d, d.turn)),
        more > 0 ? el("div", { class: "muted", text: `and ${more} more` }) : null));
    }
    const metadata = Object.fromEntries(Object.entries(item.metadata || {}).filter(([k]) => k !== "source"));
    if (Object.keys(metadata).length) {
      parts.push(el("section", {}, el("details", {}, el("summary", { text: "metadata" }), longText(pretty(metadata)))));
    }
    const rows = item.revisions.map((r) => el("tr", { class: "memory-revision", dataset: { revision: String(r.revision) } },
      el("td", { text: "r" + r.revision }),
      el("td", { class: "intent", text: r.value }),
      el("td", {}, turnLink(r.source, "memory-source"), r.source && r.source.turn_id && !r.source_turn ? [" ", badge("gone", "not in this loom")] : null),
      el("td", { text: when(r.updated_at) })));
    parts.push(el("section", { id: "memory-revisions" }, el("h3", { text: "revisions, newest first" }),
      el("table", { class: "entities" },
        el("thead", {}, el("tr", {}, ...["rev", "value", "written by", "at"].map((h) => el("th", { text: h })))),
        el("tbody", {}, rows))));
    this.box.replaceChildren(...parts);
  }
}

// The routes app.js hands here, with the hash undecoded: a page, or null.
function memoryRoute(raw, main) {
  const cut = raw.indexOf("?");
  const path = cut < 0 ? raw : raw.slice(0, cut);
  const params = new URLSearchParams(cut < 0 ? "" : raw.slice(cut + 1));
  if (path === "/memory") return new MemoryPage(main, params);
  if (path === "/memory/item") return new MemoryItemPage(main, params.get("namespace") || "", params.get("key") || "");
  return null;
}
