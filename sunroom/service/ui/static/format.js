// Formatting numbers, money, times and durations for display.

export const DASH = "—";

/** An integer with thousands separators, or a dash when unknown. */
export function num(n) {
  return n === null || n === undefined || Number.isNaN(n) ? DASH : Number(n).toLocaleString("en-US");
}

/** Micro-USD as dollars ("$0.0123"); "unknown" when null/undefined. */
export function usd(micro) {
  if (micro === null || micro === undefined) return "unknown";
  const d = micro / 1e6;
  if (d === 0) return "$0";
  if (Math.abs(d) >= 100) return `$${d.toFixed(2)}`;
  if (Math.abs(d) >= 1) return `$${d.toFixed(3)}`;
  return `$${d.toFixed(Math.abs(d) >= 0.01 ? 4 : 6)}`;
}

/** Micro-USD as an integer count ("1,234 µ$"); "unknown" when null. */
export function micro(m) {
  return m === null || m === undefined ? "unknown" : `${num(m)} µ$`;
}

/** Seconds as a short duration ("850 ms", "12.3 s", "4 m 05 s", "2 h 03 m"). */
export function dur(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return DASH;
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${String(Math.floor(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} m`;
}

/** Unix seconds as local "YYYY-MM-DD HH:MM:SS". */
export function when(ts) {
  if (ts === null || ts === undefined) return DASH;
  const d = new Date(ts * 1000);
  const p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** Tokens in + out as "in / out", dashes for unknown. */
export function tokens(inp, out) {
  if ((inp === null || inp === undefined) && (out === null || out === undefined)) return DASH;
  return `${num(inp)} / ${num(out)}`;
}

/** A JSON value pretty-printed; strings that hold JSON are parsed first. */
export function pretty(value) {
  if (typeof value === "string") {
    const t = value.trim();
    if (t.startsWith("{") || t.startsWith("[")) {
      try { return JSON.stringify(JSON.parse(t), null, 2); } catch { return value; }
    }
    return value;
  }
  if (value === undefined) return "";
  try { return JSON.stringify(value, null, 2); } catch { return String(value); }
}

/** A status name's CSS class (st-running, st-ok, st-bad, st-warn, st-idle; else st-other). */
export function statusClass(status) {
  return CLASSES[status] || "st-other";
}

// sessions (running, idle, finished, failed, interrupted), cells (ok, error, timeout, died,
// vetoed) and run results (success, max_turns, budget_exceeded, ...)
const CLASSES = {
  running: "st-running", idle: "st-idle", finished: "st-ok", ok: "st-ok", success: "st-ok",
  failed: "st-bad", error: "st-bad", died: "st-bad", timeout: "st-bad", model_error: "st-bad",
  internal_error: "st-bad", interrupted: "st-warn", vetoed: "st-warn", cancelled: "st-warn",
  max_turns: "st-warn", budget_exceeded: "st-warn", length: "st-warn",
};
