// Two threads side by side (#/compare/A/B; A and B are turn or entity ids): aligned from
// their common ancestor (/api/compare), the first pair that differs marked, and for the
// pair clicked both turns in full with the sections that differ marked (the server names
// them: request, utterance, gate_calls[i].args, observation, outcome, ...).
//
// Loaded before app.js, whose helpers (el, api, badge, renderTurn, ...) it uses.
"use strict";

const COMPARE_PAGE = 100;

class ComparePage {
  constructor(main, a, b) {
    this.a = a;
    this.b = b;
    this.inputA = el("input", { id: "compare-a", value: a, placeholder: "a turn or entity id", "aria-label": "thread A" });
    this.inputB = el("input", { id: "compare-b", value: b, placeholder: "a turn or entity id", "aria-label": "thread B" });
    const form = el("form", { class: "toolbar compare-form", onsubmit: (event) => {
      event.preventDefault();
      location.hash = `#/compare/${this.inputA.value.trim()}/${this.inputB.value.trim()}`;
    } }, el("span", { class: "muted", text: "compare" }), this.inputA,
      el("span", { class: "muted", text: "with" }), this.inputB, el("button", { type: "submit", text: "Compare" }));
    this.summary = el("div", { class: "entity-head", id: "compare-summary" });
    this.list = el("div", { class: "compare-list", id: "compare" });
    this.detail = el("div", { class: "compare-detail", id: "compare-detail" });
    main.append(form, this.summary, el("div", { class: "compare-body" }, this.list, this.detail));
    if (a && b) this.open();
  }

  async open() {
    let page;
    try {
      page = await this.fetch(0);
      if (page.first_difference !== null && page.first_difference >= page.offset + page.items.length) {
        page = await this.fetch(page.first_difference - page.first_difference % COMPARE_PAGE);
      }
    } catch (error) { showError(error); return; }
    this.render(page);
    const first = page.items.find((p) => p.index === page.first_difference);
    if (first) this.select(first);
  }

  fetch(offset) {
    const params = new URLSearchParams({ a: this.a, b: this.b, offset, limit: COMPARE_PAGE });
    return api("/api/compare?" + params);
  }

  render(page) {
    const ancestor = page.ancestor
      ? [el("span", { text: "common ancestor " }),
        el("a", { class: "mono", href: `#/e/${page.ancestor.entity_id}/t/${page.ancestor.id}`, text: `#${page.ancestor.sequence} ${page.ancestor.id}` }),
        el("span", { class: "muted", text: ` (${page.common} turn${page.common === 1 ? "" : "s"} shared)` })]
      : [el("span", { class: "muted", text: "no turn in common: aligned from their first turns" })];
    const first = page.first_difference === null
      ? el("span", { id: "compare-verdict", text: "the threads are the same" })
      : el("span", { id: "compare-verdict", text: `first difference at pair ${page.first_difference + 1} · ${page.different} of ${page.total} pairs differ` });
    this.summary.replaceChildren(...ancestor, first);
    const head = el("div", { class: "pair head" }, el("span", { text: "" }),
      el("span", { class: "mono", text: `A: ${page.a.entity_id} (${page.a.turns} turns)` }),
      el("span", { class: "mono", text: `B: ${page.b.entity_id} (${page.b.turns} turns)` }));
    const rows = page.items.map((pair) => {
      const mark = pair.index === page.first_difference;
      return el("div", {
        class: "pair" + (pair.differs.length ? " differs" : " same") + (mark ? " first" : ""),
        id: mark ? "first-difference" : null,
        dataset: { index: String(pair.index), differs: pair.differs.join(" ") },
        onclick: () => this.select(pair),
      }, el("span", { class: "idx" }, String(pair.index + 1), mark ? badge("first", "first difference") : null),
        side(pair.a), side(pair.b),
        pair.differs.length ? el("div", { class: "muted what", text: "differs: " + pair.differs.join(", ") }) : null);
    });
    const pager = el("div", { class: "pager" },
      el("button", { text: "‹ prev", disabled: page.offset === 0, onclick: () => this.page(page.offset - COMPARE_PAGE) }),
      el("span", { class: "muted", text: `${page.offset + 1}–${page.offset + page.items.length} of ${page.total} pairs` }),
      el("button", { text: "next ›", disabled: page.offset + page.items.length >= page.total, onclick: () => this.page(page.offset + COMPARE_PAGE) }));
    this.list.replaceChildren(head, ...rows, pager);
  }

  async page(offset) {
    try { this.render(await this.fetch(Math.max(0, offset))); } catch (error) { showError(error); }
  }

  async select(pair) {
    for (const row of this.list.querySelectorAll(".pair.selected")) row.classList.remove("selected");
    const row = this.list.querySelector(`.pair[data-index="${pair.index}"]`);
    if (row) row.classList.add("selected");
    const fetchTurn = (s) => s ? api("/api/turns/" + encodeURIComponent(s.id)) : Promise.resolve(null);
    let turns;
    try { turns = await Promise.all([fetchTurn(pair.a), fetchTurn(pair.b)]); } catch (error) { showError(error); return; }
    const column = (turn, name) => {
      if (!turn) return el("div", { class: "compare-side", dataset: { side: name } }, el("p", { class: "muted", text: "(no turn: this thread is shorter)" }));
      const panel = renderTurn(turn, (id, intent) => forkFrom(id, intent));
      panel.removeAttribute("id");
      for (const node of panel.querySelectorAll("[data-field]")) {
        const field = node.dataset.field;
        if (pair.differs.some((d) => d === field || d.startsWith(field + "."))) node.classList.add("differs");
      }
      if (pair.differs.includes("outcome")) panel.querySelector("h2").classList.add("differs");
      return el("div", { class: "compare-side", dataset: { side: name } }, panel);
    };
    this.detail.replaceChildren(column(turns[0], "a"), column(turns[1], "b"));
  }
}

function side(s) {
  if (!s) return el("span", { class: "muted", text: "—" });
  return el("span", { class: "side" }, el("span", { class: "seq", text: "#" + s.sequence + " " }),
    s.status === "ok" ? null : badge(s.status), " ",
    s.gates.map((g) => el("span", { class: "gate", text: g })), " ", s.preview);
}
