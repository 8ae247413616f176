// The session view: loads the whole log once (folded into the model, then rendered once), then
// follows the live stream from the last seq and applies its events per animation frame.

import { api, Follower, AuthError } from "/ui/static/api.js";
import { h, clear } from "/ui/static/dom.js";
import { SessionModel } from "/ui/static/model.js";
import { CellView, CallView } from "/ui/static/cell.js";
import { TreeView } from "/ui/static/tree.js";
import { TimelineView } from "/ui/static/timeline.js";
import { diffLines } from "/ui/static/diff.js";
import { dur, num, pretty, statusClass, tokens, usd, when } from "/ui/static/format.js";

const MAX_NOTES = 200;
const MAX_SEEN = 2000;
const GAP_MS = 200;

class TurnView {
  constructor(turn, ctx) {
    this.turn = turn;
    this.ctx = ctx;
    this.shown = 0;
    this.notes = 0;
    this.hiddenNotes = 0;
    this.items = h("div", { class: "turn-items" });
    this.more = h("div", { class: "muted", hidden: true });
    this.state = h("span", { class: "muted turn-state" });
    this.el = h("section", { class: "turn", testid: "turn", data: { turn: turn.turn, branch: turn.branch } },
      h("h4", { class: "turn-head" },
        h("span", { text: turn.turn === 0 ? "session" : `turn ${turn.turn}` }),
        turn.branch ? h("span", { class: "badge branch-badge", text: `branch ${turn.branch}` }) : null,
        this.state),
      this.items, this.more);
    this.update();
  }

  update() {
    const t = this.turn;
    for (; this.shown < t.items.length; this.shown++) {
      const it = t.items[this.shown];
      let el = null;
      if (it.kind === "text") el = h("div", { class: "assistant-text", testid: "assistant-text", text: it.text });
      else if (it.kind === "thinking") el = h("details", { class: "thinking", testid: "thinking" }, h("summary", { text: "thinking" }), h("div", { class: "thinking-text", text: it.text }));
      else if (it.kind === "cell") { const v = new CellView(it, this.ctx); this.ctx.cells.set(it, v); el = v.el; }
      else if (it.kind === "call") { const v = new CallView(it); this.ctx.register(it, v); el = v.el; }
      else if (it.kind === "note") {
        if (this.notes >= MAX_NOTES) { this.hiddenNotes++; continue; }
        this.notes++;
        el = h("div", { class: `note ${it.cls}`, testid: it.testid, data: { seq: it.seq, type: it.type } },
          h("span", { class: "note-type", text: it.type }), h("span", { text: ` ${it.text}` }));
      }
      if (el) this.items.appendChild(el);
    }
    if (this.hiddenNotes) {
      this.more.hidden = false;
      this.more.textContent = `… ${this.hiddenNotes} more notices in this turn (not shown)`;
    }
    this.state.textContent = t.ended ? ` · ${dur((t.end ?? t.start) - t.start)}` : "";
  }
}

export class SessionView {
  constructor(sid, timings) {
    this.sid = sid;
    this.timings = timings;
    this.model = new SessionModel(sid);
    this.turnViews = new Map();
    this.ctx = { sid, cells: new Map(), calls: new Map(), register: (call, v) => this.ctx.calls.set(call, v) };
    this.frame = 0;
    this.pendingSeen = [];
    this.seenOrder = [];
    this.selectedBranch = null;
    this.destroyed = false;
    this.endStatus = undefined;
    this.gaps = [];
    this.gapTimer = 0;
    this.follower = new Follower(sid, {
      onEvent: (ev) => this.onLive(ev),
      onIdle: (data) => this.onIdle(data),
      onEnd: () => this.onEnd(),
      onBroken: () => this.onBroken(),
    });
    this.el = h("div", { class: "session", testid: "session-view", data: { sid } }, h("p", { class: "muted", text: "loading…" }));
  }

  async load() {
    const m = this.model;
    const [record, , approvals] = await Promise.all([
      api.session(this.sid),
      api.log(this.sid, 0, (events) => { for (const ev of events) m.apply(ev, false); }),
      api.approvals(this.sid).catch((e) => { if (e instanceof AuthError) throw e; return { approvals: [] }; }),
    ]);
    if (this.destroyed) return;
    this.setRecord(record);
    for (const a of (approvals && approvals.approvals) || []) {
      const id = String(a.call_id);
      if (!m.answered.has(id) && !m.approvals.has(id)) m.approvals.set(id, { ...a, call_id: id });
    }
    this.build();
    this.flush();
    this.el.dataset.ready = "1";
    if (this.timings.firstView === null) this.timings.firstView = performance.now();
    this.follow();
  }

  setRecord(record) {
    const m = this.model;
    m.record = record;
    m.config = (record && record.config) || {};
    if (record && record.status) m.status = record.status;
    m.flags.header = true;
  }

  destroy() {
    this.destroyed = true;
    this.follower.stop();
    if (this.frame) cancelAnimationFrame(this.frame);
    clearTimeout(this.retry);
    clearTimeout(this.gapTimer);
  }

  // ---- live ----
  onLive(ev) {
    if (this.destroyed) return;
    if (this.streamText !== "live") this.setStream("live");
    const last = this.model.lastSeq;
    if (typeof ev.seq === "number" && ev.seq > last + 1 && last > 0) {
      this.gaps.push([last, ev.seq]); // seqs in between were skipped: internal, or unknown here
      if (!this.gapTimer) this.gapTimer = setTimeout(() => this.fillGaps(), GAP_MS);
    }
    if (this.model.apply(ev, true)) {
      this.pendingSeen.push(ev.seq);
      this.schedule();
    }
  }

  /** Fetches the seqs the stream skipped and applies the ones the page shows (rarely any). */
  async fillGaps() {
    this.gapTimer = 0;
    const gaps = this.gaps.splice(0);
    for (const [after, before] of gaps) {
      if (this.destroyed) return;
      try {
        const page = await api.logPage(this.sid, after, before - after - 1);
        let any = false;
        for (const ev of page.events || []) if (ev.seq < before && this.model.applyMissed(ev)) any = true;
        if (any) this.schedule();
      } catch (e) {
        if (e instanceof AuthError) return;
        this.gaps.push([after, before]); // try again later
        if (!this.gapTimer) this.gapTimer = setTimeout(() => this.fillGaps(), GAP_MS * 10);
        return;
      }
    }
  }

  /**
   * The session has no run in progress and everything was sent. The stream stays open (it
   * follows the session across runs: `?follow=1`), so a run another client starts shows up
   * by itself; only the record is read again, when the status may have changed.
   */
  async onIdle(data) {
    if (this.destroyed) return;
    this.setStream("idle");
    const status = data && data.status;
    if (status !== this.endStatus || this.model.status === "running") {
      this.endStatus = status;
      try {
        const record = await api.session(this.sid);
        if (!this.destroyed) { this.setRecord(record); this.schedule(); }
      } catch (e) {
        if (!(e instanceof AuthError)) this.setStream(`idle (status refresh failed: ${e.message})`);
      }
    }
  }

  /** The stream ended for good: the session was deleted. */
  onEnd() {
    if (this.destroyed) return;
    this.setStream("ended (the session is gone)");
  }

  follow() {
    this.follower.start(this.model.lastSeq);
    this.setStream("live");
  }

  async onBroken() {
    this.setStream("reconnecting…");
    try {
      await api.me(); // a 401 here means the login expired
    } catch (e) {
      if (e instanceof AuthError) { this.destroy(); window.dispatchEvent(new Event("sunroom-logged-out")); return; }
    }
    this.retry = setTimeout(() => { if (!this.destroyed) this.follow(); }, 2000);
  }

  setStream(text) {
    this.streamText = text;
    if (this.streamEl) this.streamEl.textContent = text;
  }

  schedule() {
    if (!this.frame) this.frame = requestAnimationFrame(() => { this.frame = 0; this.flush(); });
  }

  // ---- rendering ----
  build() {
    clear(this.el);
    this.statusEl = h("span", { class: "badge", testid: "session-status" });
    this.streamEl = h("span", { class: "muted stream", testid: "stream-state" });
    this.headInfo = h("div", { class: "head-info" });
    this.totalsEl = h("div", { class: "totals" });
    this.approvalsEl = h("section", { class: "approvals", testid: "approvals" });
    this.branchesEl = h("section", { class: "panel branches", testid: "branches", hidden: true });
    this.turnsEl = h("div", { class: "turns", testid: "turns" });
    this.finalEl = h("div", { class: "final-slot" }); // the answer's section appears at the end
    this.timeline = new TimelineView(this.model);
    this.tree = new TreeView(this.model.tree, this.timings, () => this.model.totals);
    const text = h("textarea", { class: "msg-text", testid: "message-text", rows: 2, placeholder: "a follow-up message…" });
    const send = h("button", { type: "submit", class: "btn", testid: "message-send", text: "send" });
    const err = h("span", { class: "error-text", testid: "message-error" });
    const form = h("form", { class: "message-form", testid: "message-form" }, text, send, err);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const value = text.value.trim();
      if (!value) return;
      send.disabled = true;
      err.textContent = "";
      try {
        await api.message(this.sid, value);
        text.value = "";
        if (!this.follower.open) this.follow(); // the stream follows the new run by itself
      } catch (ex) {
        err.textContent = ex.message;
      } finally {
        send.disabled = false;
      }
    });
    append(this.el, [
      h("header", { class: "session-head" },
        h("div", { class: "title-row" },
          h("a", { href: "#/", class: "link", text: "← sessions" }),
          h("h2", { class: "sid", text: this.sid }), this.statusEl, this.streamEl),
        this.headInfo, this.totalsEl),
      this.approvalsEl,
      this.timeline.el,
      this.tree.el,
      this.branchesEl,
      this.turnsEl,
      this.finalEl,
      form,
    ]);
  }

  flush() {
    const m = this.model;
    for (const t of m.newTurns) {
      const v = new TurnView(t, this.ctx);
      this.turnViews.set(t, v);
      this.turnsEl.appendChild(v.el);
      this.applyBranchVisibility(v);
    }
    m.newTurns.length = 0;
    for (const o of m.dirty) if (o.kind === "turn") this.turnViews.get(o)?.update();
    for (const o of m.dirty) {
      if (o.kind === "cell") this.ctx.cells.get(o)?.update();
      else if (o.kind === "call") this.ctx.calls.get(o)?.update();
    }
    m.dirty.clear();
    if (m.flags.header) { m.flags.header = false; this.renderHeader(); }
    if (m.flags.approvals) { m.flags.approvals = false; this.renderApprovals(); }
    if (m.flags.branches) { m.flags.branches = false; this.renderBranches(); }
    if (m.flags.final) { m.flags.final = false; this.renderFinal(); }
    if (m.flags.timeline) { m.flags.timeline = false; this.timeline.render(); }
    this.tree.refresh();
    if (this.pendingSeen.length) {
      const now = Date.now();
      const seen = this.timings.seen;
      for (const s of this.pendingSeen) { seen[s] = now; this.seenOrder.push(s); }
      this.pendingSeen.length = 0;
      while (this.seenOrder.length > MAX_SEEN) delete seen[this.seenOrder.shift()];
    }
  }

  renderHeader() {
    const m = this.model;
    const st = m.status || "unknown";
    this.statusEl.className = `badge ${statusClass(st)}`;
    this.statusEl.textContent = st;
    const c = m.config || {};
    clear(this.headInfo);
    const field = (k, v, testid) => h("span", { class: "field" }, h("span", { class: "muted", text: `${k} ` }), h("span", { testid, text: v ?? "—" }));
    append(this.headInfo, [
      field("model", c.model, "session-model"),
      c.sub_model ? field("sub-model", c.sub_model) : null,
      field("preset", c.preset, "session-preset"),
      field("created", when(m.record && m.record.created_at))]);
    if (c.task) this.headInfo.appendChild(h("div", { class: "task", testid: "session-task", title: String(c.task), text: String(c.task) }));
    const t = m.totals;
    clear(this.totalsEl);
    append(this.totalsEl, [
      field("tokens in / out", tokens(t.input_tokens, t.output_tokens), "session-tokens"),
      field("model calls", num(t.model_calls), "session-calls"),
      field("cost", m.costSeen ? usd(t.cost_micro_usd) : "—", "session-cost"),
      field("events", String(m.count), "event-count")]);
  }

  renderApprovals() {
    clear(this.approvalsEl);
    for (const a of this.model.approvals.values()) {
      const allow = h("button", { type: "button", class: "btn allow", testid: "approve-allow", text: "Allow" });
      const deny = h("button", { type: "button", class: "btn deny", testid: "approve-deny", text: "Deny" });
      const err = h("span", { class: "error-text" });
      const answer = async (yes) => {
        allow.disabled = true;
        deny.disabled = true;
        err.textContent = "";
        try {
          await api.answer(this.sid, a.call_id, yes, yes ? "allowed in the web view" : "denied in the web view");
        } catch (e) {
          err.textContent = e.message;
          allow.disabled = false;
          deny.disabled = false;
        }
      };
      allow.addEventListener("click", () => answer(true));
      deny.addEventListener("click", () => answer(false));
      this.approvalsEl.appendChild(h("div", { class: "approval", testid: "approval", data: { callId: a.call_id } },
        h("div", { class: "approval-head" },
          h("strong", { text: "approval needed: " }), h("span", { class: "hc-name", text: String(a.name ?? "") }),
          h("span", { class: "muted", text: ` #${a.call_id}${a.depth ? ` · depth ${a.depth}` : ""}${a.timeout_s ? ` · times out in ${dur(a.timeout_s)}` : ""}` })),
        h("pre", { class: "hc-args", text: pretty(a.arguments) }),
        h("div", { class: "approval-actions" }, allow, deny, err)));
    }
  }

  applyBranchVisibility(v) {
    const b = v.turn.branch;
    v.el.hidden = !!b && b !== this.selectedBranch;
  }

  renderBranches() {
    const m = this.model;
    if (!m.branches.length) { this.branchesEl.hidden = true; return; }
    this.branchesEl.hidden = false;
    if (this.selectedBranch === null || !m.branchInfo.has(this.selectedBranch)) this.selectedBranch = m.chosen ?? m.branches[0];
    clear(this.branchesEl);
    const tabs = h("div", { class: "tabs", role: "tablist" });
    for (const id of m.branches) {
      const info = m.branchInfo.get(id);
      const st = info.result && info.result.status;
      const tab = h("button", { type: "button", class: `tab${id === this.selectedBranch ? " selected" : ""}`, testid: "branch", data: { branch: id }, role: "tab" },
        h("span", { text: `branch ${id}` }),
        st ? h("span", { class: `badge ${statusClass(st)}`, text: st }) : h("span", { class: "badge st-running", text: "running" }),
        id === m.chosen ? h("span", { class: "badge chosen", testid: "branch-chosen", text: "chosen" }) : null);
      tab.addEventListener("click", () => {
        this.selectedBranch = id;
        for (const v of this.turnViews.values()) this.applyBranchVisibility(v);
        this.renderBranches();
      });
      tabs.appendChild(tab);
    }
    append(this.branchesEl, [h("h3", { text: "branches" }), tabs]);
    if (m.chosenReason) this.branchesEl.appendChild(h("div", { class: "muted", text: `chosen: ${m.chosen ?? "none"} — ${m.chosenReason}` }));
    const base = m.chosen ?? m.branches[0];
    const other = this.selectedBranch !== base ? this.selectedBranch : m.branches.find((b) => b !== base);
    if (other !== undefined) {
      const codeOf = (b) => { const l = m.lanes.get(b); return l && l.lastCell ? l.lastCell.code : ""; };
      const pre = h("pre", { class: "diff" });
      for (const d of diffLines(codeOf(base), codeOf(other))) {
        pre.appendChild(h("div", { class: `diff-line ${d.op === "+" ? "add" : d.op === "-" ? "del" : "same"}`, testid: "diff-line", data: { op: d.op }, text: `${d.op} ${d.text}` }));
      }
      this.branchesEl.appendChild(h("div", { class: "branch-diff", testid: "branch-diff" },
        h("div", { class: "muted", text: `final cells: branch ${base} → branch ${other}` }), pre));
    }
    for (const v of this.turnViews.values()) this.applyBranchVisibility(v);
  }

  renderFinal() {
    const f = this.model.final;
    clear(this.finalEl);
    if (!f) return;
    const st = f.status || "ended";
    this.finalEl.appendChild(h("section", { class: "panel final", testid: "final-answer" },
      h("h3", {}, "final answer ", h("span", { class: `badge ${statusClass(st)}`, testid: "final-status", text: st })),
      h("pre", { class: "final-output", testid: "final-output", text: f.output === undefined || f.output === null ? "(no output)" : pretty(f.output) }),
      f.error ? h("pre", { class: "hc-error", testid: "final-error", text: typeof f.error === "string" ? f.error : pretty(f.error) }) : null));
  }
}

/** Appends element children, skipping null (Element.append would print "null"). */
function append(el, kids) { for (const k of kids) if (k) el.appendChild(k); }
