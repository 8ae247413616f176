// Boot and routing: who is logged in, the login form, and which view the hash names.

import { api, setUnauthorized, AuthError } from "/ui/static/api.js";
import { h, clear } from "/ui/static/dom.js";
import { ListView } from "/ui/static/list.js";
import { SessionView } from "/ui/static/session.js";

const timings = { firstView: null, seen: {}, expand: [] };
window.sunroomTimings = timings;

const main = document.getElementById("main");
const logoutBtn = document.getElementById("logout");
let current = null;

function setView(name) { document.body.dataset.view = name; }

function stopCurrent() {
  if (current) { current.destroy(); current = null; }
}

function showError(msg) {
  clear(main).appendChild(h("p", { class: "error-text", testid: "page-error", text: msg }));
}

function showLogin() {
  stopCurrent();
  setView("login");
  logoutBtn.hidden = true;
  const input = h("input", { type: "password", testid: "login-token", name: "token", autocomplete: "off", placeholder: "token", id: "login-token" });
  const submit = h("button", { type: "submit", class: "btn", testid: "login-submit", text: "log in" });
  const error = h("div", { class: "error-text", testid: "login-error" });
  const form = h("form", { class: "login", testid: "login-form" },
    h("h2", { text: "log in" }),
    h("label", { for: "login-token", text: "service token" }), input, submit, error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const token = input.value;
    input.value = ""; // never kept: typed once, posted once
    if (!token) { error.textContent = "Type the service token."; return; }
    submit.disabled = true;
    error.textContent = "";
    try {
      await api.login(token);
      route();
    } catch (ex) {
      error.textContent = ex instanceof AuthError ? ex.message : `The login failed: ${ex.message}`;
      submit.disabled = false;
      input.focus();
    }
  });
  clear(main).appendChild(form);
  input.focus();
}

async function route() {
  stopCurrent();
  logoutBtn.hidden = false;
  const hash = location.hash || "#/";
  const m = /^#\/sessions\/([^/]+)$/.exec(hash);
  let view;
  if (m) {
    setView("session");
    view = new SessionView(decodeURIComponent(m[1]), timings);
  } else {
    setView("list");
    view = new ListView();
  }
  current = view;
  clear(main).appendChild(view.el);
  try {
    await view.load();
  } catch (e) {
    if (e instanceof AuthError) return; // the login form is showing
    if (current === view) showError(`This page could not load: ${e.message}`);
  }
}

async function boot() {
  setUnauthorized(showLogin);
  window.addEventListener("sunroom-logged-out", showLogin);
  logoutBtn.addEventListener("click", async () => {
    try { await api.logout(); } catch (e) { if (!(e instanceof AuthError)) { showError(`Logging out failed: ${e.message}`); return; } }
    showLogin();
  });
  window.addEventListener("hashchange", () => { if (document.body.dataset.view !== "login") route(); });
  try {
    await api.me();
  } catch (e) {
    if (e instanceof AuthError) { showLogin(); return; }
    showError(`The server could not be reached: ${e.message}`);
    return;
  }
  route();
}

boot();
