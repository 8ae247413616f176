// Folds a session's events into a model (turns, cells, host calls, approvals, branches, tree)
// without touching the DOM. Views read the model and the change marks it keeps.

import { TreeModel } from "/ui/static/treemodel.js";

/** Types that are not shown (the service's own bookkeeping). */
const IGNORED = new Set(["Transcript"]);

class Lane {
  constructor(key) {
    this.key = key;              // "" for the session's own events, else the branch id
    this.turns = new Map();
    this.current = null;         // the turn of the last event that named one
    this.openCell = null;
    this.pending = new Map();    // turn -> {code, via}: submitted, not started yet
    this.cells = new Map();      // cell number -> cell
    this.calls = new Map();      // String(call_id) -> call
    this.lastCell = null;
  }
}

let uid = 0;

export class SessionModel {
  constructor(sid) {
    this.sid = sid;
    this.lastSeq = 0;
    this.missed = new Set();     // seqs applied out of order (see applyMissed)
    this.count = 0;
    this.status = null;
    this.record = null;
    this.config = {};
    this.totals = { input_tokens: null, output_tokens: null, model_calls: null, cost_micro_usd: null };
    this.costSeen = false;
    this.firstTs = null;
    this.lastTs = null;
    this.lanes = new Map();
    this.turns = [];             // every turn, creation order
    this.approvals = new Map();  // call_id -> ApprovalRequested (pending only)
    this.answered = new Set();
    this.branches = [];          // branch ids, in announcement order
    this.branchInfo = new Map(); // id -> {id, result}
    this.chosen = null;
    this.chosenReason = null;
    this.final = null;           // the last SessionEnded: {status, output, error, seq}
    this.tree = new TreeModel("session");
    // change marks, taken by the view at each flush
    this.dirty = new Set();      // turns, cells and calls that changed
    this.newTurns = [];
    this.flags = { header: true, approvals: true, branches: true, final: true, timeline: true };
  }

  lane(branch) {
    const key = branch || "";
    let l = this.lanes.get(key);
    if (!l) { l = new Lane(key); this.lanes.set(key, l); }
    return l;
  }

  turn(lane, n, ts) {
    let t = lane.turns.get(n);
    if (!t) {
      t = { kind: "turn", key: `${lane.key}/${n}`, branch: lane.key, turn: n, items: [], start: ts,
        end: null, ended: false };
      lane.turns.set(n, t);
      this.turns.push(t);
      this.newTurns.push(t);
    }
    lane.current = t;
    return t;
  }

  currentTurn(lane, ts) {
    return lane.current || this.turn(lane, 0, ts);
  }

  push(turn, item) {
    turn.items.push(item);
    this.dirty.add(turn);
  }

  note(lane, ev, testid, text, cls = "") {
    const t = this.currentTurn(lane, ev.ts);
    this.push(t, { kind: "note", id: ++uid, type: ev.type, testid, text, cls, seq: ev.seq, ts: ev.ts });
  }

  /**
   * Applies one event; false when it was already applied (seq <= last) or is not shown.
   * `live`: it came over the stream (a session that publishes is running).
   */
  apply(ev, live = false) {
    if (!ev || typeof ev.seq !== "number" || ev.seq <= this.lastSeq) return false;
    this.lastSeq = ev.seq;
    return this._fold(ev, live);
  }

  /**
   * Applies an event the live stream skipped (a seq below the last applied one, fetched from
   * the log afterwards: a type this page does not listen for); each seq at most once.
   */
  applyMissed(ev) {
    if (!ev || typeof ev.seq !== "number" || ev.seq >= this.lastSeq || this.missed.has(ev.seq)) return false;
    this.missed.add(ev.seq);
    return this._fold(ev, false);
  }

  _fold(ev, live) {
    if (IGNORED.has(ev.type)) return false;
    this.count++;
    if (typeof ev.ts === "number") {
      if (this.firstTs === null || ev.ts < this.firstTs) this.firstTs = ev.ts;
      if (this.lastTs === null || ev.ts > this.lastTs) this.lastTs = ev.ts;
    }
    if (live && ev.type !== "SessionEnded" && !ev.branch && this.status !== "running") {
      this.status = "running";
    }
    const lane = this.lane(ev.branch);
    const handler = HANDLERS[ev.type];
    if (handler) handler(this, lane, ev);
    else this.note(lane, ev, "event-generic", summarise(ev), "generic");
    this.flags.header = true;
    this.flags.timeline = true;
    return true;
  }

  cellFor(lane, ev) {
    const cell = {
      kind: "cell", id: ++uid, key: `${lane.key}/${ev.cell ?? `x${uid}`}`, branch: lane.key,
      turn: ev.turn, cell: ev.cell ?? null, lines: ev.lines ?? null, code: "", via: null,
      start: ev.ts, end: null, chunks: [], dropped: 0, finished: false, status: null, output: "",
      duration: null, stateLost: false, outputs: [], finishSeq: null, truncatedChars: 0,
      truncatedBytes: 0, calls: [],
    };
    const p = lane.pending.get(ev.turn);
    if (p) {
      cell.code = p.code;
      cell.via = p.via;
      lane.pending.delete(ev.turn);
    }
    return cell;
  }

  callKey(lane, callId) { return `${lane.key}/${callId}`; }
}

function summarise(ev) {
  const rest = {};
  for (const [k, v] of Object.entries(ev)) if (!["seq", "ts", "type", "branch"].includes(k)) rest[k] = v;
  const s = JSON.stringify(rest);
  return s.length > 400 ? `${s.slice(0, 400)}…` : s;
}

function str(v) { return typeof v === "string" ? v : v === undefined || v === null ? "" : JSON.stringify(v); }

const HANDLERS = {
  AssistantText(m, lane, ev) {
    m.push(m.turn(lane, ev.turn, ev.ts), { kind: "text", id: ++uid, text: str(ev.text) });
  },
  Thinking(m, lane, ev) {
    if (!ev.text) return;
    m.push(m.turn(lane, ev.turn, ev.ts), { kind: "thinking", id: ++uid, text: str(ev.text) });
  },
  CodeSubmitted(m, lane, ev) {
    m.turn(lane, ev.turn, ev.ts);
    lane.pending.set(ev.turn, { code: str(ev.code), via: ev.via || null });
  },
  CellStarted(m, lane, ev) {
    const t = m.turn(lane, ev.turn, ev.ts);
    const cell = m.cellFor(lane, ev);
    lane.openCell = cell;
    lane.lastCell = cell;
    if (cell.cell !== null) lane.cells.set(cell.cell, cell);
    m.push(t, cell);
  },
  OutputChunk(m, lane, ev) {
    const cell = lane.cells.get(ev.cell) || lane.openCell;
    if (!cell) return;
    if (ev.text) cell.chunks.push({ stream: ev.stream, text: str(ev.text) });
    if (ev.dropped_bytes) cell.dropped += ev.dropped_bytes;
    m.dirty.add(cell);
  },
  ExecutionFinished(m, lane, ev) {
    let cell = lane.openCell;
    if (!cell || cell.turn !== ev.turn) {
      // finished without a start (vetoed before it ran): a cell from its submitted code
      const t = m.turn(lane, ev.turn, ev.ts);
      cell = m.cellFor(lane, { turn: ev.turn, ts: ev.ts });
      lane.lastCell = cell;
      m.push(t, cell);
    }
    lane.openCell = null;
    cell.finished = true;
    cell.end = ev.ts;
    cell.status = ev.status || null;
    cell.output = str(ev.output);
    cell.duration = typeof ev.duration_s === "number" ? ev.duration_s : null;
    cell.stateLost = !!ev.state_lost;
    cell.outputs = Array.isArray(ev.outputs) ? ev.outputs : [];
    cell.finishSeq = ev.seq;
    cell.truncatedChars = ev.truncated_chars || 0;
    cell.truncatedBytes = ev.truncated_bytes || 0;
    if (cell.start === null && typeof ev.duration_s === "number") cell.start = ev.ts - ev.duration_s;
    m.dirty.add(cell);
  },
  HostCallStarted(m, lane, ev) {
    const call = {
      kind: "call", id: ++uid, callId: ev.call_id, name: str(ev.name), arguments: ev.arguments ?? null,
      result: null, error: null, duration: null, cost: undefined, finished: false, start: ev.ts,
      end: null, progress: null, items: [], cell: lane.openCell,
    };
    lane.calls.set(String(ev.call_id), call);
    if (lane.openCell) {
      lane.openCell.calls.push(call);
      m.dirty.add(lane.openCell);
    } else {
      m.push(m.currentTurn(lane, ev.ts), call);
    }
  },
  HostCallFinished(m, lane, ev) {
    let call = lane.calls.get(String(ev.call_id));
    if (!call) {
      HANDLERS.HostCallStarted(m, lane, { ...ev, arguments: null });
      call = lane.calls.get(String(ev.call_id));
    }
    call.finished = true;
    call.end = ev.ts;
    call.duration = typeof ev.duration_s === "number" ? ev.duration_s : null;
    call.cost = ev.cost_micro_usd ?? null;
    call.error = ev.error ?? null;
    call.result = ev.result ?? null;
    m.tree.callFinished(m.callKey(lane, ev.call_id), call.duration, call.error);
    m.dirty.add(call);
  },
  PredictProgress(m, lane, ev) {
    const call = lane.calls.get(String(ev.call_id));
    if (!call) return;
    call.progress = { done: ev.done, total: ev.total, failed: ev.failed };
    m.dirty.add(call);
  },
  NetworkConnection(m, lane, ev) {
    const verdict = ev.allowed ? "allowed" : `denied${ev.reason ? `: ${ev.reason}` : ""}`;
    m.note(lane, ev, "network", `${ev.scheme || "tcp"}://${ev.host}:${ev.port} ${verdict} · ↑${ev.bytes_sent ?? 0} B ↓${ev.bytes_received ?? 0} B`, ev.allowed ? "net" : "net warn");
  },
  SubmitAccepted(m, lane, ev) { m.note(lane, ev, "submit-accepted", "submit accepted", "ok"); },
  SubmitRejected(m, lane, ev) { m.note(lane, ev, "submit-rejected", `submit rejected: ${str(ev.reason)}`, "warn"); },
  Vetoed(m, lane, ev) { m.note(lane, ev, "vetoed", `vetoed ${str(ev.what)}: ${str(ev.reason)}`, "warn"); },
  ApprovalRequested(m, lane, ev) {
    const id = String(ev.call_id);
    if (!m.answered.has(id)) m.approvals.set(id, { ...ev, call_id: id });
    m.flags.approvals = true;
    m.note(lane, ev, "approval-requested", `approval requested: ${str(ev.name)}`, "warn");
  },
  ApprovalAnswered(m, lane, ev) {
    const id = String(ev.call_id);
    m.approvals.delete(id);
    m.answered.add(id);
    m.flags.approvals = true;
    m.note(lane, ev, "approval-answered", `${ev.allow ? "allowed" : "denied"} ${str(ev.name)} (by ${ev.by || "person"}${ev.reason ? `: ${ev.reason}` : ""})`, ev.allow ? "ok" : "warn");
  },
  UsageUpdated(m, lane, ev) {
    if (ev.branch) return;
    const u = ev.usage || {};
    m.totals.input_tokens = u.input_tokens ?? m.totals.input_tokens;
    m.totals.output_tokens = u.output_tokens ?? m.totals.output_tokens;
    m.totals.model_calls = ev.model_calls ?? m.totals.model_calls;
    m.totals.cost_micro_usd = ev.cost_micro_usd ?? null;
    m.costSeen = true;
    m.tree.version++; // the root row shows the session's totals
  },
  BudgetWarning(m, lane, ev) { m.note(lane, ev, "budget-warning", `budget (${str(ev.limit)}): ${str(ev.message)}`, "warn"); },
  ContextWarning(m, lane, ev) { m.note(lane, ev, "context-warning", `context: ${ev.tokens} of ${ev.context_window} tokens`, "warn"); },
  ContextCompacted(m, lane, ev) { m.note(lane, ev, "context-compacted", `context compacted: ${ev.tokens_before} → ${ev.tokens_after} tokens (${ev.removed} removed)`, ""); },
  SessionError(m, lane, ev) { m.note(lane, ev, "session-error", str(ev.message), "error"); },
  TurnEnded(m, lane, ev) {
    const t = m.turn(lane, ev.turn, ev.ts);
    t.ended = true;
    t.end = ev.ts;
    m.dirty.add(t);
  },
  SessionEnded(m, lane, ev) {
    const r = ev.result || {};
    m.final = { status: r.status ?? null, output: r.output, error: r.error ?? null, seq: ev.seq, result: r };
    if (!ev.branch) {
      m.status = r.status || m.status;
      const u = r.usage || {};
      if (u.input_tokens !== undefined) m.totals.input_tokens = u.input_tokens;
      if (u.output_tokens !== undefined) m.totals.output_tokens = u.output_tokens;
      if (r.model_calls !== undefined) m.totals.model_calls = r.model_calls;
      if (r.cost_micro_usd !== undefined) { m.totals.cost_micro_usd = r.cost_micro_usd; m.costSeen = true; }
    }
    lane.openCell = null;
    m.flags.final = true;
  },
  BranchesStarted(m, lane, ev) {
    for (const b of ev.branches || []) {
      const id = String(b);
      if (!m.branchInfo.has(id)) { m.branchInfo.set(id, { id, result: null }); m.branches.push(id); }
    }
    m.flags.branches = true;
    m.note(lane, ev, "branches-started", `${(ev.branches || []).length} branches (choose: ${str(ev.choose)})`, "");
  },
  BranchEnded(m, lane, ev) {
    const id = String(ev.branch || "");
    if (!m.branchInfo.has(id)) { m.branchInfo.set(id, { id, result: null }); m.branches.push(id); }
    m.branchInfo.get(id).result = ev.result || null;
    m.flags.branches = true;
  },
  BranchChosen(m, lane, ev) {
    m.chosen = ev.chosen === null || ev.chosen === undefined ? null : String(ev.chosen);
    m.chosenReason = ev.reason || null;
    m.flags.branches = true;
    m.note(lane, ev, "branch-chosen-note", `chose ${m.chosen ?? "no branch"}${ev.reason ? `: ${ev.reason}` : ""}`, "ok");
  },
  KernelRestarted(m, lane, ev) {
    const parts = [`kernel restarted: ${str(ev.reason)}`];
    if (ev.state_lost) parts.push("state lost");
    if (ev.unknown_calls && ev.unknown_calls.length) parts.push(`unknown calls: ${str(ev.unknown_calls)}`);
    if (ev.denied_approvals && ev.denied_approvals.length) parts.push(`denied approvals: ${str(ev.denied_approvals)}`);
    lane.openCell = null;
    m.note(lane, ev, "kernel-restart", parts.join(" · "), "error");
  },
  CallOutcomeUnknown(m, lane, ev) {
    m.note(lane, ev, "call-outcome-unknown", `outcome unknown: ${str(ev.name)} #${ev.call_id} ${str(ev.args)}`, "warn");
  },
  UserMessage(m, lane, ev) {
    m.note(lane, ev, "user-message", str(ev.text ?? ev.message ?? ""), "user");
  },
  MessageReceived(m, lane, ev) {
    m.note(lane, ev, "user-message", str(ev.text), "user");
  },
  KernelStarted(m, lane, ev) {
    m.note(lane, ev, "kernel-started", `kernel started${typeof ev.seconds === "number" ? ` in ${ev.seconds} s` : ""}`, "quiet");
  },
  KernelStartFailed(m, lane, ev) {
    m.note(lane, ev, "session-error", `the kernel did not start: ${str(ev.error)}`, "error");
  },
  SubCallEnded(m, lane, ev) {
    let parentCall = null;
    if (ev.parent === null || ev.parent === undefined) {
      const call = lane.calls.get(String(ev.call_id));
      const cell = call ? call.cell : null;
      const where = cell
        ? `${lane.key ? `branch ${lane.key} · ` : ""}cell ${cell.cell ?? "?"}, turn ${cell.turn}`
        : "outside a cell";
      const name = call ? call.name : (ev.name || "predict");
      parentCall = m.tree.call(m.callKey(lane, ev.call_id), `${name} #${ev.call_id} · ${where}`);
      if (call) {
        if (parentCall.latency === null && call.duration !== null) parentCall.latency = call.duration;
        call.items.push({ index: ev.index, start: ev.ts - (ev.duration_s || 0), end: ev.ts,
          latency: ev.duration_s, cost: ev.cost_micro_usd ?? null, error: ev.error || null });
      }
    }
    m.tree.subCall(ev, parentCall);
  },
};
