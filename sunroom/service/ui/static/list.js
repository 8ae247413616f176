// The sessions list (refreshed every 2 s while visible) and the raw kernels table.

import { api, AuthError } from "/ui/static/api.js";
import { h, clear } from "/ui/static/dom.js";
import { dur, num, statusClass, tokens, usd, when } from "/ui/static/format.js";

const STATUSES = ["running", "idle", "finished", "failed", "interrupted"];
const PERIOD_MS = 2000;

export class ListView {
  constructor() {
    this.sessions = [];
    this.timer = 0;
    this.destroyed = false;
    this.filter = h("input", { type: "search", class: "filter", testid: "session-filter", placeholder: "filter by id, task, model, preset", autocomplete: "off" });
    this.status = h("select", { class: "filter", testid: "status-filter" }, h("option", { value: "", text: "any status" }),
      ...STATUSES.map((s) => h("option", { value: s, text: s })));
    this.filter.addEventListener("input", () => this.renderSessions());
    this.status.addEventListener("change", () => this.renderSessions());
    this.body = h("tbody");
    this.kbody = h("tbody");
    this.error = h("div", { class: "error-text", testid: "list-error" });
    this.count = h("span", { class: "muted" });
    const th = (t) => h("th", { text: t });
    this.el = h("div", { class: "list", testid: "list-view" },
      h("div", { class: "toolbar" }, h("h2", { text: "sessions" }), this.filter, this.status, this.count),
      this.error,
      h("table", { class: "table sessions", testid: "sessions-table" },
        h("thead", {}, h("tr", {}, ...["session", "status", "preset", "model", "started", "duration", "turns", "model calls", "tokens in / out", "cost"].map(th))),
        this.body),
      h("h2", { text: "kernels" }),
      h("table", { class: "table kernels", testid: "kernels-table" },
        h("thead", {}, h("tr", {}, ...["kernel", "backend", "kernel name", "sandbox", "template", "created"].map(th))),
        this.kbody));
    this.onVisible = () => { if (document.visibilityState === "visible") this.tick(); };
    document.addEventListener("visibilitychange", this.onVisible);
  }

  async load() {
    await this.tick();
  }

  destroy() {
    this.destroyed = true;
    clearTimeout(this.timer);
    document.removeEventListener("visibilitychange", this.onVisible);
  }

  async tick() {
    clearTimeout(this.timer);
    if (this.destroyed) return;
    try {
      const [s, k] = await Promise.all([api.sessions(), api.kernels().catch((e) => {
        if (e instanceof AuthError) throw e;
        return { kernels: [], error: e.message };
      })]);
      if (this.destroyed) return;
      this.sessions = s.sessions || [];
      this.error.textContent = k.error ? `kernels: ${k.error}` : "";
      this.renderSessions();
      this.renderKernels(k.kernels || []);
    } catch (e) {
      if (e instanceof AuthError) { this.destroy(); return; }
      this.error.textContent = e.message;
    }
    if (!this.destroyed && document.visibilityState === "visible") this.timer = setTimeout(() => this.tick(), PERIOD_MS);
  }

  renderSessions() {
    const q = this.filter.value.trim().toLowerCase();
    const st = this.status.value;
    const known = new Set([...this.status.options].map((o) => o.value));
    for (const s of this.sessions) {
      if (s.status && !known.has(s.status)) { known.add(s.status); this.status.appendChild(h("option", { value: s.status, text: s.status })); }
    }
    const rows = this.sessions.filter((s) => {
      if (st && s.status !== st) return false;
      if (!q) return true;
      return [s.session_id, s.task, s.model, s.preset].some((v) => typeof v === "string" && v.toLowerCase().includes(q));
    });
    clear(this.body);
    const now = Date.now() / 1000;
    for (const s of rows) {
      const end = s.finished_at ?? (s.status === "running" ? now : s.updated_at);
      const d = s.created_at !== null && s.created_at !== undefined && end !== null && end !== undefined ? end - s.created_at : null;
      const href = `#/sessions/${encodeURIComponent(s.session_id)}`;
      const tr = h("tr", { testid: "session-row", data: { sessionId: s.session_id, status: s.status ?? "" } },
        h("td", { class: "sid-cell" },
          h("a", { href, class: "sid-link", text: s.session_id }),
          s.task ? h("div", { class: "task-line muted", title: String(s.task), text: String(s.task) }) : null),
        h("td", {}, h("span", { class: `badge ${statusClass(s.status)}`, testid: "row-status", text: s.status ?? "—" })),
        h("td", { text: s.preset ?? "—" }),
        h("td", { text: s.model ?? "—" }),
        h("td", { class: "nowrap", text: when(s.created_at) }),
        h("td", { class: "num", text: dur(d) }),
        h("td", { class: "num", text: num(s.turns) }),
        h("td", { class: "num", text: s.sub_calls ? `${num(s.model_calls)} (+${num(s.sub_calls)} sub)` : num(s.model_calls) }),
        h("td", { class: "num", text: tokens(s.input_tokens, s.output_tokens) }),
        h("td", { class: "num", testid: "row-cost", text: usd(s.cost_micro_usd) }));
      tr.addEventListener("click", (e) => { if (e.target.tagName !== "A") location.hash = href; });
      this.body.appendChild(tr);
    }
    this.count.textContent = `${rows.length} of ${this.sessions.length}`;
  }

  renderKernels(kernels) {
    clear(this.kbody);
    for (const k of kernels) {
      this.kbody.appendChild(h("tr", { testid: "kernel-row", data: { kernelId: k.kernel_id } },
        h("td", { class: "mono", text: k.kernel_id }), h("td", { text: k.backend ?? "—" }),
        h("td", { text: k.kernel_name ?? "—" }), h("td", { text: typeof k.sandbox === "string" ? k.sandbox : k.sandbox === null || k.sandbox === undefined ? "—" : JSON.stringify(k.sandbox) }),
        h("td", { text: k.template ?? "—" }), h("td", { class: "nowrap", text: when(k.created_at) })));
    }
    if (!kernels.length) this.kbody.appendChild(h("tr", {}, h("td", { colspan: 6, class: "muted", text: "no kernels" })));
  }
}
