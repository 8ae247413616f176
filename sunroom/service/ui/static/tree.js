// The recursion tree's view: the visible nodes flattened and drawn through a virtual list.
// Expanding builds the child rows then (the list holds only the rows in the viewport).

import { h } from "/ui/static/dom.js";
import { VirtualList } from "/ui/static/virtual.js";
import { dur, num, DASH } from "/ui/static/format.js";

const ROW = 24;

export class TreeView {
  /** `totals()`: the session's totals so far (the root row: every model call, the root's own). */
  constructor(tree, timings, totals) {
    this.tree = tree;
    this.totals = totals;
    this.timings = timings;
    this.rows = [];
    this.seenStructure = -1;
    this.seenVersion = -1;
    this.list = new VirtualList({ rowHeight: ROW, renderRow: (i) => this.row(this.rows[i]), maxHeight: 420, testid: "tree-rows" });
    this.el = h("section", { class: "panel tree", testid: "tree" },
      h("h3", { text: "recursion tree" }),
      h("div", { class: "tree-head" },
        h("span", { text: "node" }), h("span", { text: "latency" }), h("span", { text: "tokens in / out" }),
        h("span", { text: "own µ$" }), h("span", { text: "rolled-up µ$" })),
      this.list.el);
    this.refresh(true);
  }

  /** Re-flattens when the structure changed, repaints when any value changed. */
  refresh(force = false) {
    if (force || this.tree.structure !== this.seenStructure) {
      this.seenStructure = this.tree.structure;
      this.seenVersion = this.tree.version;
      this.rows = this.tree.flatten();
      this.list.update(this.rows.length);
    } else if (this.tree.version !== this.seenVersion) {
      this.seenVersion = this.tree.version;
      this.list.update(this.rows.length);
    }
  }

  toggle(node) {
    const t0 = performance.now();
    node.expanded = !node.expanded;
    this.rows = this.tree.flatten();
    this.list.update(this.rows.length);
    const ms = performance.now() - t0;
    if (node.expanded) {
      this.timings.expand.push(ms);
      if (this.timings.expand.length > 100) this.timings.expand.shift();
    }
  }

  row(node) {
    const kids = node.children.length;
    const toggle = kids
      ? h("button", { type: "button", class: "tree-toggle", testid: "tree-toggle", ariaLabel: node.expanded ? "collapse" : "expand", text: node.expanded ? "▾" : "▸" })
      : h("span", { class: "tree-toggle none" });
    if (kids) toggle.addEventListener("click", () => this.toggle(node));
    const label = h("span", { class: "tree-label" }, toggle,
      h("span", { class: "tree-name", text: node.filled ? node.label : `${node.label} (pending)` }),
      kids > 1 ? h("span", { class: "tree-count", testid: "tree-count", text: ` ${num(kids)}` }) : null,
      node.error ? h("span", { class: "tree-error", testid: "tree-error", title: node.error, text: " ✖" }) : null,
      node.rollErrors > (node.error ? 1 : 0) ? h("span", { class: "tree-errs", title: "errors in this subtree", text: ` ${node.rollErrors - (node.error ? 1 : 0)} ✖ below` }) : null);
    label.style.paddingLeft = `${node.level * 14}px`;
    let ownTxt = node.kind === "item" ? (node.own === null ? "unknown" : num(node.own)) : DASH;
    let rollTxt = `${num(node.rollCost)}${node.rollUnknown ? ` +${node.rollUnknown} unknown` : ""}`;
    let tokTxt = node.kind === "item" ? `${num(node.inTok)} / ${num(node.outTok)}` : `${num(node.rollIn)} / ${num(node.rollOut)}`;
    const t = node.kind === "root" && this.totals ? this.totals() : null;
    if (t && t.input_tokens !== null) {
      // the session: its own (root-model) spend is what the sub-calls below did not spend
      tokTxt = `${num(t.input_tokens)} / ${num(t.output_tokens)}`;
      const total = t.cost_micro_usd;
      rollTxt = total === null ? "unknown" : num(total);
      ownTxt = total === null || node.rollUnknown ? "unknown" : num(Math.max(0, total - node.rollCost));
    }
    const title = [node.label, node.input ? `input: ${node.input}` : "", node.output ? `output: ${node.output}` : "",
      node.error ? `error: ${node.error}` : ""].filter(Boolean).join("\n");
    return h("div", { class: `tree-node${node.error ? " has-error" : ""}`, testid: "tree-node", title,
      data: { node: node.id, depth: node.level, kind: node.kind } },
      label,
      h("span", { class: "num", text: dur(node.latency) }),
      h("span", { class: "num", text: tokTxt }),
      h("span", { class: "num", testid: "tree-own", text: ownTxt }),
      h("span", { class: "num", testid: "tree-rollup", text: rollTxt }));
  }
}
