// The recursion tree's data: session -> predict calls (labelled with their cell) -> items ->
// nested items. A node's level is its depth in this tree (root 0, call 1, item 2, ...).
// Rollups (own + all descendants) are kept incrementally: adding a node adds its totals to its
// ancestors once (O(depth)); nothing walks the tree per event.

export class TreeNode {
  constructor(id, kind, label) {
    this.id = id;
    this.kind = kind;            // "root" | "call" | "item"
    this.label = label;
    this.parent = null;
    this.attached = false;       // linked under its parent (placeholders are not, yet)
    this.children = [];
    this.sorted = true;
    this.expanded = false;
    this.depth = 0;              // the SubCallEnded's depth (1 = a sub-call of the root session)
    this.level = 0;              // depth in this tree (root 0, call 1, item 2, nested item 3)
    this.index = null;
    this.latency = null;
    this.inTok = null;
    this.outTok = null;
    this.own = null;             // own cost in micro-USD (null: unknown or not applicable)
    this.ownUnknown = false;
    this.rollCost = 0;
    this.rollUnknown = 0;        // how many nodes in this subtree have an unknown cost
    this.rollIn = 0;
    this.rollOut = 0;
    this.rollErrors = 0;
    this.error = null;
    this.filled = kind !== "item";
    this.recursive = false;
    this.input = null;
    this.output = null;
  }
}

export class TreeModel {
  constructor(label) {
    this.root = new TreeNode("session", "root", label);
    this.root.attached = true;
    this.root.expanded = true;
    this.nodes = new Map([["session", this.root]]);
    this.version = 0;            // bumps on any change (the view redraws when it moved)
    this.structure = 0;          // bumps when children change
  }

  _attach(node, parent) {
    node.parent = parent;
    node.attached = true;
    node.level = parent.level + 1;
    this._relevel(node);
    parent.children.push(node);
    parent.sorted = false;
    for (let a = parent; a; a = a.parent) {
      a.rollCost += node.rollCost;
      a.rollUnknown += node.rollUnknown;
      a.rollIn += node.rollIn;
      a.rollOut += node.rollOut;
      a.rollErrors += node.rollErrors;
      if (!a.attached) break;
    }
    this.structure++;
  }

  _relevel(node) {
    // Only subtrees that were built under a placeholder need this (rare and small).
    for (const c of node.children) {
      c.level = node.level + 1;
      if (c.children.length) this._relevel(c);
    }
  }

  /**
   * The predict/predict_many host call node (created on first use), a child of the root; its
   * label names its cell, and calls come in cell order.
   */
  call(key, label) {
    const id = `call:${key}`;
    let n = this.nodes.get(id);
    if (!n) {
      n = new TreeNode(id, "call", label);
      this.nodes.set(id, n);
      this._attach(n, this.root);
    }
    return n;
  }

  /** Sets a call node's latency (from HostCallFinished), if the node exists. */
  callFinished(key, duration, error) {
    const n = this.nodes.get(`call:${key}`);
    if (!n) return;
    n.latency = duration;
    if (error && !n.error) n.error = error;
    this.version++;
  }

  _placeholder(id) {
    let n = this.nodes.get(id);
    if (!n) {
      n = new TreeNode(id, "item", id);
      this.nodes.set(id, n);
    }
    return n;
  }

  /**
   * A SubCallEnded. `parentCall` is the node for its predict call when ev.parent is null
   * (the model resolves it: it knows the cells); ignored otherwise.
   */
  subCall(ev, parentCall) {
    const id = String(ev.node);
    const n = this._placeholder(id);
    if (n.filled) return; // the same node twice: keep the first
    n.filled = true;
    n.label = `${ev.name || "predict"} [${ev.index}]${ev.model ? ` ${ev.model}` : ""}`;
    n.index = typeof ev.index === "number" ? ev.index : null;
    n.depth = typeof ev.depth === "number" ? ev.depth : 1;
    n.latency = typeof ev.duration_s === "number" ? ev.duration_s : null;
    n.inTok = ev.input_tokens ?? null;
    n.outTok = ev.output_tokens ?? null;
    n.own = typeof ev.cost_micro_usd === "number" ? ev.cost_micro_usd : null;
    n.ownUnknown = n.own === null;
    n.error = ev.error || null;
    n.input = ev.input ?? null;
    n.output = ev.output ?? null;
    n.recursive = !!ev.recursive;
    n.rollCost += n.own || 0;
    n.rollUnknown += n.ownUnknown ? 1 : 0;
    n.rollIn += n.inTok || 0;
    n.rollOut += n.outTok || 0;
    n.rollErrors += n.error ? 1 : 0;
    const parent = ev.parent === null || ev.parent === undefined
      ? parentCall : this._placeholder(String(ev.parent));
    this._attach(n, parent);
    this.version++;
  }

  /** A node's children in display order (items by index), sorted lazily. */
  childrenOf(node) {
    if (!node.sorted) {
      node.children.sort((a, b) => {
        if (a.index !== null && b.index !== null && a.index !== b.index) return a.index - b.index;
        return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
      });
      node.sorted = true;
    }
    return node.children;
  }

  /** The visible rows: every node whose ancestors are all expanded, depth first. */
  flatten() {
    const out = [];
    const walk = (node) => {
      out.push(node);
      if (node.expanded) for (const c of this.childrenOf(node)) walk(c);
    };
    walk(this.root);
    return out;
  }
}
