// Talking to the server: JSON over fetch (cookie + CSRF header) and the SSE event stream.

/** Thrown when the server answers 401: the page goes back to the login form. */
export class AuthError extends Error {}

/** Thrown for any other non-2xx answer; message is the server's one sentence when it gave one. */
export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

let onUnauthorized = () => {};

/** Sets what happens on any 401 (the app shows the login form). */
export function setUnauthorized(fn) { onUnauthorized = fn; }

/**
 * request(method, path, body?) -> parsed JSON (or null for an empty body).
 * Always same-origin credentials and the X-Sunroom-CSRF header; 401 -> AuthError (and the
 * unauthorized hook runs, unless quiet), other errors -> ApiError.
 */
export async function request(method, path, body, { quiet = false } = {}) {
  const init = {
    method,
    credentials: "same-origin",
    cache: "no-store",
    headers: { "X-Sunroom-CSRF": "1", Accept: "application/json" },
  };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (res.status === 401) {
    const msg = (data && data.error && data.error.message) || "You are not logged in.";
    if (!quiet) onUnauthorized();
    throw new AuthError(msg);
  }
  if (!res.ok) {
    const msg = (data && data.error && data.error.message) || `The server answered ${res.status}.`;
    throw new ApiError(res.status, msg);
  }
  return data;
}

const enc = encodeURIComponent;

export const api = {
  me: () => request("GET", "/ui/me", undefined, { quiet: true }),
  login: (token) => request("POST", "/ui/login", { token }, { quiet: true }),
  logout: () => request("POST", "/ui/logout", {}),
  sessions: () => request("GET", "/ui/api/sessions?limit=200"),
  kernels: () => request("GET", "/kernels"),
  session: (sid) => request("GET", `/sessions/${enc(sid)}`),
  approvals: (sid) => request("GET", `/sessions/${enc(sid)}/approvals`),
  answer: (sid, callId, allow, reason) =>
    request("POST", `/sessions/${enc(sid)}/approvals/${enc(callId)}`, { allow, reason }),
  message: (sid, text) => request("POST", `/sessions/${enc(sid)}/messages`, { text }),
  /** One page of the log after seq `after` (at most `limit` events). */
  logPage: (sid, after, limit) =>
    request("GET", `/ui/api/sessions/${enc(sid)}/log?after=${after}&limit=${Math.max(1, limit)}`),
  /** The whole log after seq `after`, following `more` until done; calls onPage(events). */
  async log(sid, after, onPage, limit = 10000) {
    let seq = after;
    for (;;) {
      const page = await request("GET", `/ui/api/sessions/${enc(sid)}/log?after=${seq}&limit=${limit}`);
      onPage(page.events || []);
      const last = typeof page.last_seq === "number" ? page.last_seq : seq;
      if (!page.more || last <= seq) return last;
      seq = last;
    }
  },
};

/**
 * Every event type the stream may name (EventSource dispatches a named event only to its own
 * listeners). A type missing here is still shown: the session view fetches the seqs the stream
 * skipped from the log (see SessionView.fillGaps).
 */
export const EVENT_TYPES = [
  "AssistantText", "Thinking", "CodeSubmitted", "CellStarted", "OutputChunk", "ExecutionFinished",
  "HostCallStarted", "HostCallFinished", "NetworkConnection", "PredictProgress", "SubmitAccepted",
  "SubmitRejected", "Vetoed", "ApprovalRequested", "ApprovalAnswered", "UsageUpdated",
  "BudgetWarning", "ContextWarning", "ContextCompacted", "SessionError", "TurnEnded",
  "SessionEnded", "BranchesStarted", "BranchEnded", "BranchChosen", "KernelRestarted",
  "CallOutcomeUnknown", "UserMessage", "SubCallEnded", "MessageReceived", "KernelStarted",
  "KernelStartFailed", "message",
];

/**
 * A session's live stream from seq `after`, following it across runs (`?follow=1`):
 * onEvent(parsed) per message, onIdle(data) at `event: idle` (no run in progress, everything
 * sent: data {status, last_seq}; the stream stays open), onEnd(data) at `event: end` (the
 * session is gone; the stream is closed), onBroken() when the browser gave up reconnecting.
 * EventSource resends Last-Event-ID on reconnect by itself.
 */
export class Follower {
  constructor(sid, { onEvent, onIdle, onEnd, onBroken }) {
    this.sid = sid;
    this.onEvent = onEvent;
    this.onIdle = onIdle;
    this.onEnd = onEnd;
    this.onBroken = onBroken;
    this.es = null;
  }

  get open() { return this.es !== null; }

  start(after) {
    this.stop();
    const es = new EventSource(`/sessions/${enc(this.sid)}/events?after=${after}&follow=1`);
    this.es = es;
    const handle = (msg) => {
      let data;
      try { data = JSON.parse(msg.data); } catch { return; }
      if (data && typeof data === "object") this.onEvent(data);
    };
    for (const t of EVENT_TYPES) es.addEventListener(t, handle);
    es.addEventListener("idle", (msg) => {
      let data = {};
      try { data = JSON.parse(msg.data) || {}; } catch { data = {}; }
      this.onIdle(data);
    });
    es.addEventListener("end", (msg) => {
      this.stop();
      let data = {};
      try { data = JSON.parse(msg.data) || {}; } catch { data = {}; }
      this.onEnd(data);
    });
    es.addEventListener("error", () => {
      if (es.readyState === EventSource.CLOSED && this.es === es) {
        this.es = null;
        this.onBroken();
      }
    });
  }

  stop() {
    if (this.es) {
      this.es.close();
      this.es = null;
    }
  }
}
