// Rich display outputs of a cell: images as data: URLs, HTML only in a sandboxed frame served by
// the server, JSON pretty-printed, everything else as plain text.

import { h } from "/ui/static/dom.js";
import { pretty } from "/ui/static/format.js";

const ORDER = ["text/html", "image/png", "image/jpeg", "image/gif", "image/svg+xml",
  "application/json", "text/markdown", "text/plain"];
const RASTER = new Set(["image/png", "image/jpeg", "image/gif"]);
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function b64text(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(bin);
}

function asText(v) {
  if (Array.isArray(v)) return v.join(""); // notebook-style line lists
  return typeof v === "string" ? v : pretty(v);
}

/** One display item -> an element. sid/seq/index address its frame (for text/html). */
export function renderOutput(item, sid, seq, index) {
  const data = (item && typeof item === "object" && item.data) || {};
  const mime = ORDER.find((m) => m in data) || Object.keys(data)[0];
  if (!mime) return h("pre", { class: "out-text", testid: "output-text", text: "(empty output)" });
  const value = data[mime];
  if (mime === "text/html") {
    return h("iframe", {
      class: "out-frame",
      testid: "output-html-frame",
      sandbox: "allow-scripts",
      referrerpolicy: "no-referrer",
      title: "HTML output",
      src: `/ui/frame/${encodeURIComponent(sid)}/${seq}/${index}`,
    });
  }
  if (RASTER.has(mime)) {
    const b = asText(value).replace(/\s+/g, "");
    if (!BASE64.test(b)) return h("pre", { class: "out-text warn", testid: "output-text", text: `(an ${mime} output that is not base64)` });
    return h("img", { class: "out-img", testid: "output-image", alt: mime, src: `data:${mime};base64,${b}` });
  }
  if (mime === "image/svg+xml") {
    return h("img", { class: "out-img", testid: "output-image", alt: mime, src: `data:image/svg+xml;base64,${b64text(asText(value))}` });
  }
  if (mime === "application/json") {
    return h("pre", { class: "out-text", testid: "output-text", text: typeof value === "string" ? pretty(value) : JSON.stringify(value, null, 2) });
  }
  return h("pre", { class: "out-text", testid: "output-text", text: asText(value) });
}
