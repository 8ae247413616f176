// The turn timeline: one row per turn; its cells as bars on a shared time axis and a predict
// call's items as parallel thin bars (one per item, from SubCallEnded), drawn on a canvas.

import { h, clear } from "/ui/static/dom.js";
import { dur, micro } from "/ui/static/format.js";

const LANE_PX = 3;
const MAX_LANES = 60;

export class TimelineView {
  constructor(model) {
    this.model = model;
    this.body = h("div", { class: "tl-body" });
    this.axis = h("div", { class: "tl-axis muted" });
    this.el = h("section", { class: "panel timeline", testid: "timeline" },
      h("h3", { text: "timeline" }), this.axis, this.body);
    this.render();
  }

  render() {
    const m = this.model;
    clear(this.body);
    const t0 = m.firstTs ?? 0;
    const t1 = Math.max((m.lastTs ?? t0) , t0 + 0.001);
    const span = t1 - t0;
    this.axis.textContent = `0 — ${dur(span)}`;
    const pct = (t) => `${Math.max(0, Math.min(100, ((t - t0) / span) * 100))}%`;
    const width = (a, b) => `${Math.max(0.3, ((Math.max(b, a) - a) / span) * 100)}%`;
    for (const turn of m.turns) {
      const cells = turn.items.filter((it) => it.kind === "cell");
      if (turn.turn === 0 && !cells.length) continue; // session notices only: no bar to draw
      const track = h("div", { class: "tl-track" });
      const tEnd = turn.end ?? m.lastTs ?? turn.start;
      const band = h("div", { class: "tl-turn" });
      band.style.left = pct(turn.start);
      band.style.width = width(turn.start, tEnd);
      track.appendChild(band);
      const items = [];
      for (const c of cells) {
        const s = c.start ?? turn.start;
        const e = c.end ?? m.lastTs ?? s;
        const bar = h("div", { class: `tl-cell ${c.finished ? (c.status === "ok" ? "ok" : "bad") : "live"}`, testid: "timeline-cell",
          title: `cell ${c.cell ?? "?"}: ${c.finished ? `${c.status} · ${dur(c.duration)}` : "running"}` });
        bar.style.left = pct(s);
        bar.style.width = width(s, e);
        track.appendChild(bar);
        for (const call of c.calls) for (const it of call.items) items.push({ ...it, call: call.callId, name: call.name });
      }
      const row = h("div", { class: "tl-row", data: { turn: turn.turn, branch: turn.branch } },
        h("div", { class: "tl-label", text: `${turn.branch ? `${turn.branch} ` : ""}turn ${turn.turn}` }), track);
      if (items.length) row.appendChild(this.canvas(items, t0, span));
      this.body.appendChild(row);
    }
  }

  canvas(items, t0, span) {
    // pack items into lanes by start time (an item takes the first lane free by then), so the
    // picture shows how many ran at once; past MAX_LANES the earliest-free lane is shared
    items.sort((a, b) => a.start - b.start);
    const laneEnd = [];
    for (const it of items) {
      let lane = laneEnd.findIndex((end) => end <= it.start);
      if (lane === -1) {
        if (laneEnd.length < MAX_LANES) lane = laneEnd.length;
        else lane = laneEnd.indexOf(Math.min(...laneEnd));
      }
      laneEnd[lane] = it.end;
      it.lane = lane;
    }
    const lanes = Math.max(1, laneEnd.length);
    const cv = h("canvas", { class: "tl-items", testid: "timeline-items", title: `${items.length} sub-calls` });
    const cssH = lanes * LANE_PX + 2;
    cv.style.height = `${cssH}px`;
    const draw = () => {
      const w = cv.clientWidth || 600;
      const dpr = window.devicePixelRatio || 1;
      cv.width = Math.round(w * dpr);
      cv.height = Math.round(cssH * dpr);
      const g = cv.getContext("2d");
      g.scale(dpr, dpr);
      const style = getComputedStyle(cv);
      const ok = style.getPropertyValue("--bar-ok").trim() || "#4a8";
      const bad = style.getPropertyValue("--bar-bad").trim() || "#c44";
      for (const it of items) {
        const lane = it.lane;
        const x = ((it.start - t0) / span) * w;
        const bw = Math.max(1, ((it.end - it.start) / span) * w);
        g.fillStyle = it.error ? bad : ok;
        g.fillRect(x, 1 + lane * LANE_PX, bw, LANE_PX - 0.5);
      }
    };
    requestAnimationFrame(draw);
    cv.addEventListener("mousemove", (e) => {
      const r = cv.getBoundingClientRect();
      const t = t0 + ((e.clientX - r.left) / r.width) * span;
      const lane = Math.floor((e.clientY - r.top - 1) / LANE_PX);
      let best = null;
      for (const it of items) {
        if (it.lane !== lane) continue;
        if (t >= it.start && t <= it.end) { best = it; break; }
      }
      cv.title = best
        ? `${best.name} #${best.call} [${best.index}]: ${dur(best.latency)} · ${micro(best.cost)}${best.error ? ` · error: ${best.error}` : ""}`
        : `${items.length} sub-calls`;
    });
    return cv;
  }
}
