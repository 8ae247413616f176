// A cell's view: highlighted code, live output (append-only), status, rich outputs, host calls.

import { h, clear } from "/ui/static/dom.js";
import { highlight } from "/ui/static/highlight.js";
import { renderOutput } from "/ui/static/outputs.js";
import { dur, micro, pretty, statusClass } from "/ui/static/format.js";

const COLLAPSE_LINES = 40;
const MAX_CALLS = 200;

/** A block of text lines that collapses past 40 lines with a "show all" toggle. */
function collapsible(pre, lines) {
  const wrap = h("div", { class: "collapsible" }, pre);
  if (lines > COLLAPSE_LINES) {
    wrap.classList.add("collapsed");
    const btn = h("button", { type: "button", class: "link show-all", testid: "show-all", text: `show all ${lines} lines` });
    btn.addEventListener("click", () => {
      const was = wrap.classList.toggle("collapsed");
      btn.textContent = was ? `show all ${lines} lines` : "show less";
    });
    wrap.appendChild(btn);
  }
  return wrap;
}

function lineCount(text) {
  let n = 1;
  for (let i = text.indexOf("\n"); i !== -1; i = text.indexOf("\n", i + 1)) n++;
  return n;
}

export class CallView {
  constructor(call) {
    this.call = call;
    this.el = h("div", { class: "hostcall", testid: "host-call", data: { callId: call.callId } });
    this.update();
  }

  update() {
    const c = this.call;
    clear(this.el);
    const state = c.error ? "error" : c.finished ? "ok" : "running";
    this.el.className = `hostcall ${statusClass(state)}`;
    const head = h("div", { class: "hc-head" },
      h("span", { class: "hc-name", text: `${c.name}` }),
      h("span", { class: "muted", text: ` #${c.callId}` }),
      c.progress ? h("span", { class: "hc-progress", testid: "predict-progress", text: ` ${c.progress.done}/${c.progress.total}${c.progress.failed ? ` (${c.progress.failed} failed)` : ""}` }) : null,
      h("span", { class: "hc-meta", text: c.finished ? `${dur(c.duration)} · ${c.cost === undefined ? "" : micro(c.cost)}` : "running…" }));
    this.el.appendChild(head);
    if (c.arguments !== null && c.arguments !== undefined && c.arguments !== "") {
      this.el.appendChild(h("pre", { class: "hc-args", testid: "host-call-args", text: pretty(c.arguments) }));
    }
    if (c.error) this.el.appendChild(h("pre", { class: "hc-error", testid: "host-call-error", text: c.error }));
    else if (c.result !== null && c.result !== undefined) this.el.appendChild(h("pre", { class: "hc-result", testid: "host-call-result", text: pretty(c.result) }));
  }
}

export class CellView {
  constructor(cell, ctx) {
    this.cell = cell;
    this.ctx = ctx;             // {sid, register(callView)}
    this.chunksShown = 0;
    this.callsShown = 0;
    this.finishedShown = false;
    const code = h("pre", { class: "code", testid: "cell-code" });
    code.appendChild(highlight(cell.code || ""));
    this.status = h("span", { class: "cell-status", testid: "cell-status" });
    this.badges = h("span", { class: "cell-badges" });
    this.out = h("pre", { class: "output", testid: "cell-output" });
    this.outWrap = h("div", { class: "collapsible out-wrap" }, this.out);
    this.rich = h("div", { class: "rich" });
    this.calls = h("div", { class: "calls" });
    this.more = h("div", { class: "muted", hidden: true });
    this.el = h("div", { class: "cell", testid: "cell", data: { cell: cell.cell ?? "" } },
      h("div", { class: "cell-head" },
        h("span", { class: "cell-no", text: cell.cell !== null ? `[${cell.cell}]` : "[·]" }),
        cell.via ? h("span", { class: "muted", text: ` via ${cell.via}` }) : null,
        this.badges, this.status),
      collapsible(code, cell.code ? lineCount(cell.code) : 0),
      this.outWrap, this.rich, this.calls, this.more);
    this.update();
  }

  update() {
    const c = this.cell;
    // live output: append only the chunks not shown yet
    if (!this.finishedShown) {
      for (; this.chunksShown < c.chunks.length; this.chunksShown++) {
        const ch = c.chunks[this.chunksShown];
        if (ch.stream === "stderr") this.out.appendChild(h("span", { class: "stderr", text: ch.text }));
        else this.out.appendChild(document.createTextNode(ch.text));
      }
    }
    for (; this.callsShown < c.calls.length && this.callsShown < MAX_CALLS; this.callsShown++) {
      const v = new CallView(c.calls[this.callsShown]);
      this.ctx.register(c.calls[this.callsShown], v);
      this.calls.appendChild(v.el);
    }
    if (c.calls.length > MAX_CALLS) {
      this.more.hidden = false;
      this.more.textContent = `… ${c.calls.length - MAX_CALLS} more host calls in this cell`;
    }
    if (c.finished && !this.finishedShown) {
      this.finishedShown = true;
      const streamed = this.out.textContent;
      if (!streamed) {
        this.out.textContent = c.output; // nothing streamed: what the model was shown
      } else if (c.output && c.output.trimEnd() !== streamed.trimEnd()) {
        // the stream stays; what the model saw besides it (a value, an error, a notice) follows
        const head = streamed.trimEnd();
        const rest = c.output.startsWith(head) ? c.output.slice(head.length) : null;
        if (rest !== null) {
          if (rest.trim()) this.outWrap.appendChild(h("pre", { class: "output result", testid: "cell-result", text: rest.replace(/^\n+/, "") }));
        } else {
          this.outWrap.appendChild(h("details", { class: "model-saw", testid: "cell-result" },
            h("summary", { text: "what the model was shown" }), h("pre", { class: "output", text: c.output })));
        }
      }
      if (c.dropped) this.outWrap.appendChild(h("div", { class: "muted", text: `${c.dropped} bytes were not streamed` }));
      if (c.truncatedChars || c.truncatedBytes) {
        this.outWrap.appendChild(h("div", { class: "muted", testid: "cell-truncated", text: `truncated: ${c.truncatedChars} chars for the model, ${c.truncatedBytes} bytes at the source` }));
      }
      const lines = lineCount(this.out.textContent);
      if (lines > COLLAPSE_LINES) {
        this.outWrap.classList.add("collapsed");
        const btn = h("button", { type: "button", class: "link show-all", testid: "show-all", text: `show all ${lines} lines` });
        btn.addEventListener("click", () => {
          const was = this.outWrap.classList.toggle("collapsed");
          btn.textContent = was ? `show all ${lines} lines` : "show less";
        });
        this.outWrap.appendChild(btn);
      }
      c.outputs.forEach((item, i) => this.rich.appendChild(renderOutput(item, this.ctx.sid, c.finishSeq, i)));
      if (c.stateLost) this.badges.appendChild(h("span", { class: "badge st-bad", testid: "state-lost", text: "state lost" }));
    }
    if (!this.out.firstChild) this.out.classList.add("empty");
    else this.out.classList.remove("empty");
    const st = c.finished ? c.status || "done" : "running";
    this.status.className = `cell-status badge ${statusClass(st)}`;
    this.status.textContent = c.finished ? `${st} · ${dur(c.duration)}` : "running…";
  }
}
