// The console's shell: sign-in, the navigation, and a hash router that hands the main area to
// one page module at a time. Routes live in the fragment (#/review/<id>), which browsers never
// send to a server, so no id or token appears in a request line or a log.

import { ApiError, call, follow, setToken, signOut, token } from "./api.js";
import { announce, errorBox, h, pageTitle } from "./ui.js";
import * as overview from "./pages/overview.js";
import * as review from "./pages/review.js";
import * as approvals from "./pages/approvals.js";
import * as operations from "./pages/operations.js";
import * as timeline from "./pages/timeline.js";
import * as trace from "./pages/trace.js";
import * as webhooks from "./pages/webhooks.js";

const ROLE_KEY = "opledger.role";
const NAME_KEY = "opledger.name";
const SCOPE_KEY = "opledger.scope";

const PAGES = { overview, review, approvals, operations, timeline, trace, webhooks };

/// Listeners of the live feed: pages subscribe while shown.
const listeners = new Set();
let stopFeed = null;
let cleanup = null;
/// Counts page changes, so a page that finishes loading after the reader moved on is put away
/// at once instead of keeping its live-feed listener.
let generation = 0;
/// Why the person is back at sign-in, shown once above the form.
let signInNotice = null;

/// What every page gets: the signed-in role, and the live feed.
const context = {
  role: () => sessionStorage.getItem(ROLE_KEY),
  /// The principal's name as configured (an operator's id), who claims and decides.
  name: () => sessionStorage.getItem(NAME_KEY),
  onEvent(listener) {
    listeners.add(listener);
    return () => listeners.delete(listener);
  },
};

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = hash.split("?");
  const [page = "", ...rest] = path.split("/").map(decodeURIComponent);
  return { page, id: rest.join("/") || null, query: new URLSearchParams(query) };
}

async function show() {
  const shown = ++generation;
  const main = document.getElementById("main");
  if (cleanup) {
    cleanup();
    cleanup = null;
  }
  if (!token()) {
    renderSignIn(main);
    return;
  }
  startShell();
  const { page, id, query } = route();
  const name = page === "operation" ? "timeline" : page;
  const module = PAGES[name];
  if (!module) {
    location.hash = context.role() === "operator" ? "#/review" : "#/overview";
    return;
  }
  for (const a of document.querySelectorAll("#nav a")) {
    const current = a.dataset.page === name || (name === "timeline" && a.dataset.page === "operations");
    if (current) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  main.replaceChildren();
  try {
    const stop = (await module.render(main, { id, query }, context)) ?? null;
    if (shown === generation) cleanup = stop;
    else if (stop) stop();
  } catch (error) {
    if (shown === generation) main.replaceChildren(pageTitle("Something went wrong"), errorBox(asApiError(error), show));
    return;
  }
  if (shown !== generation) return;
  document.getElementById("page-title")?.focus();
}

function asApiError(error) {
  return error instanceof ApiError ? error : new ApiError(0, "console", error.message);
}

function renderSignIn(main) {
  stopShell();
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "off",
    required: true,
    minlength: "16",
    "aria-describedby": "token-help",
  });
  const message = h("div", { id: "sign-in-message" });
  const form = h(
    "form",
    { class: "sign-in card", novalidate: true },
    h("label", { for: "token" }, "Access token"),
    input,
    h(
      "p",
      { id: "token-help", class: "help" },
      "An operator, approver or tenant token from this server's configuration. It is kept in this tab only and sent as a bearer header; closing the tab forgets it.",
    ),
    h("button", { type: "submit", class: "primary" }, "Sign in"),
    message,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (value.length < 16) {
      message.replaceChildren(
        errorBox(new ApiError(0, "invalid_token", "A token is at least 16 characters long."), null),
      );
      input.focus();
      return;
    }
    message.replaceChildren(h("p", { class: "muted" }, "Checking the token…"));
    try {
      const me = await call("GET", "/v1/whoami", undefined, value);
      const role = me.kind;
      setToken(value);
      sessionStorage.setItem(ROLE_KEY, role);
      sessionStorage.setItem(NAME_KEY, me.name);
      sessionStorage.setItem(SCOPE_KEY, me.tenants === null ? "every tenant" : me.tenants.join(", "));
      announce(`Signed in as ${role}`);
      const start = role === "operator" ? "#/review" : "#/overview";
      // Changing the fragment shows the page (hashchange); the same fragment changes nothing.
      if (location.hash === start) show();
      else location.hash = start;
    } catch (error) {
      message.replaceChildren(errorBox(asApiError(error), null));
      input.focus();
    }
  });
  const notice = signInNotice ? h("p", { class: "warning", role: "alert" }, signInNotice) : null;
  signInNotice = null;
  main.replaceChildren(
    ...[
      pageTitle("Sign in"),
      notice,
      h(
        "p",
        { class: "lead" },
        "The console shows what opledger recorded about your operations: what awaits a person, what happened to each request, and the evidence behind it.",
      ),
      form,
    ].filter(Boolean),
  );
  document.getElementById("page-title")?.focus();
}

function startShell() {
  const role = context.role();
  document.getElementById("nav").hidden = false;
  document.getElementById("who").hidden = false;
  // Who is signed in, by name, and what they see: "oncall (operator, every tenant)".
  const name = sessionStorage.getItem(NAME_KEY);
  const scope = sessionStorage.getItem(SCOPE_KEY);
  document.getElementById("who-role").textContent = name ? `Signed in: ${name} (${role}, ${scope})` : `Signed in: ${role}`;
  for (const item of document.querySelectorAll("#nav [data-role]")) {
    const wanted = item.dataset.role;
    item.hidden = wanted === "operator" ? role !== "operator" : role === "operator";
  }
  if (!stopFeed) {
    const live = document.getElementById("live");
    stopFeed = follow(
      (event) => {
        for (const listener of listeners) listener(event);
      },
      (state) => {
        if (state === "live") live.textContent = "live";
        else if (state === "reconnecting") live.textContent = "reconnecting…";
        else live.textContent = `feed stopped: ${state.message ?? state}`;
        live.dataset.state = state === "live" ? "live" : "down";
      },
    );
  }
}

function stopShell() {
  if (stopFeed) stopFeed();
  stopFeed = null;
  document.getElementById("nav").hidden = true;
  document.getElementById("who").hidden = true;
}

document.getElementById("sign-out").addEventListener("click", () => {
  signOut();
  for (const key of [ROLE_KEY, NAME_KEY, SCOPE_KEY]) sessionStorage.removeItem(key);
  location.hash = "";
  show();
});
window.addEventListener("opledger:unauthorized", (event) => {
  signOut();
  for (const key of [ROLE_KEY, NAME_KEY, SCOPE_KEY]) sessionStorage.removeItem(key);
  signInNotice = `This server no longer accepts the token (${event.detail ?? "unauthorized"}). Sign in again.`;
  show();
});
window.addEventListener("hashchange", show);
show();
