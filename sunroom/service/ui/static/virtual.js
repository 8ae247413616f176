// A virtualised list: fixed row height; only the rows in the viewport (plus overscan) exist in
// the DOM. The caller gives the row count and a function that builds row i.

import { h, clear } from "/ui/static/dom.js";

export class VirtualList {
  /**
   * rowHeight: px per row; renderRow(i) -> HTMLElement (positioned by the list);
   * maxHeight: px of the viewport (the list grows up to it, then scrolls).
   */
  constructor({ rowHeight, renderRow, maxHeight = 480, overscan = 10, testid }) {
    this.rowHeight = rowHeight;
    this.renderRow = renderRow;
    this.maxHeight = maxHeight;
    this.overscan = overscan;
    this.count = 0;
    this.spacer = h("div", { class: "vl-spacer" });
    this.el = h("div", { class: "vl", testid }, this.spacer);
    this.el.addEventListener("scroll", () => this._schedule(), { passive: true });
    this.frame = 0;
    this.rendered = { from: -1, to: -1 };
  }

  _schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => { this.frame = 0; this._paint(false); });
  }

  /** Sets the row count and repaints the visible rows (always rebuilt: rows may have changed). */
  update(count) {
    this.count = count;
    this.el.style.height = `${Math.min(this.maxHeight, count * this.rowHeight + 2)}px`;
    this.spacer.style.height = `${count * this.rowHeight}px`;
    this._paint(true);
  }

  /** Scrolls row i into view. */
  reveal(i) {
    const top = i * this.rowHeight;
    if (top < this.el.scrollTop || top + this.rowHeight > this.el.scrollTop + this.el.clientHeight) {
      this.el.scrollTop = Math.max(0, top - this.el.clientHeight / 2);
    }
    this._paint(true);
  }

  _paint(force) {
    const view = this.el.clientHeight || this.maxHeight;
    const first = Math.floor(this.el.scrollTop / this.rowHeight);
    const from = Math.max(0, first - this.overscan);
    const to = Math.min(this.count, first + Math.ceil(view / this.rowHeight) + this.overscan);
    if (!force && from === this.rendered.from && to === this.rendered.to) return;
    this.rendered = { from, to };
    clear(this.spacer);
    for (let i = from; i < to; i++) {
      const row = this.renderRow(i);
      row.classList.add("vl-row");
      row.style.top = `${i * this.rowHeight}px`;
      row.style.height = `${this.rowHeight}px`;
      this.spacer.appendChild(row);
    }
  }
}
