// Building DOM safely: elements via createElement, text via text nodes. Never innerHTML.

/**
 * h(tag, props, ...children) -> HTMLElement.
 * props: class, testid (-> data-testid), data (object -> dataset), text (textContent),
 * title, hidden, type, href, src, value, placeholder, name, disabled, sandbox, alt, for,
 * autocomplete, loading, role, ariaLabel; on (object of event listeners).
 * children: nodes or strings (strings become text nodes); null/undefined/false are skipped.
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null || value === false) continue;
      switch (key) {
        case "class": el.className = value; break;
        case "testid": el.dataset.testid = value; break;
        case "data": for (const [k, v] of Object.entries(value)) el.dataset[k] = String(v); break;
        case "text": el.textContent = String(value); break;
        case "on": for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn); break;
        case "hidden": el.hidden = true; break;
        case "disabled": el.disabled = true; break;
        case "ariaLabel": el.setAttribute("aria-label", String(value)); break;
        case "for": el.htmlFor = String(value); break;
        case "title": case "type": case "href": case "src": case "value": case "placeholder":
        case "name": case "sandbox": case "alt": case "autocomplete": case "loading": case "role":
        case "id": case "rows": case "colspan": case "referrerpolicy":
          el.setAttribute(key, String(value)); break;
        default: throw new Error(`h(): unsupported property ${key}`);
      }
    }
  }
  append(el, children);
  return el;
}

/** Appends children (nodes or strings; arrays are flattened; null/false skipped). */
export function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (typeof c === "string" || typeof c === "number") el.appendChild(document.createTextNode(String(c)));
    else el.appendChild(c);
  }
  return el;
}

/** Removes every child of el. */
export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}
