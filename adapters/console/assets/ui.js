// Small DOM helpers: every page builds its markup with `h`, which sets text as text (never as
// markup), so nothing the API returns can inject HTML or script.

/// An element: `h("p", {class: "x"}, "text", child, [more])`. Attributes starting with `on`
/// become listeners; `null`/`false` children are skipped.
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (value === true) {
      element.setAttribute(name, "");
    } else {
      element.setAttribute(name, String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(element, child);
    else element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/// What each API state means to a person, and its badge class.
export const STATES = {
  awaiting_approval: ["awaiting approval", "wait"],
  denied: ["denied", "end"],
  pending: ["pending", "busy"],
  in_flight: ["sending", "busy"],
  succeeded: ["succeeded", "ok"],
  rejected: ["rejected", "bad"],
  unknown: ["unknown outcome", "warn"],
  needs_review: ["needs review", "warn"],
  abandoned: ["abandoned", "end"],
};

export function badge(state) {
  const [label, kind] = STATES[state] ?? [state, "end"];
  return h("span", { class: `badge badge-${kind}` }, label);
}

/// "2026-12-03 07:34:58.169 UTC": to the millisecond, because attempts and lookups a few hundred
/// milliseconds apart looked simultaneous to the second (the raw JSON keeps the rest).
export function time(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return iso;
  return `${date.toISOString().slice(0, 23).replace("T", " ")} UTC`;
}

/// A duration in words a person reads at a glance: "7 ms", "2.6 s", "4 min 10 s", "3 h 2 min".
export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours} h ${m % 60} min`;
  return `${Math.floor(hours / 24)} days`;
}

export function between(fromIso, toIso) {
  return duration(new Date(toIso).getTime() - new Date(fromIso).getTime());
}

/// An API error shown with its message and what to do next.
export function errorBox(error, retry) {
  return h(
    "div",
    { class: "error", role: "alert" },
    h("p", { class: "error-title" }, error.code ? `Error: ${error.code}` : "Error"),
    h("p", {}, error.message),
    error.advice ? h("p", { class: "advice" }, error.advice) : null,
    retry ? h("button", { type: "button", onclick: retry }, "Try again") : null,
  );
}

/// A small form asking which tenant to show, for a token that sees several; `chosen(tenant)` on
/// submit.
export function tenantPicker(message, chosen) {
  const input = h("input", { id: "tenant-choice", name: "tenant", type: "text", autocomplete: "off", required: true });
  const form = h(
    "form",
    { class: "card warning", "aria-labelledby": "tenant-choice-label" },
    h("p", { id: "tenant-choice-label" }, message),
    h("label", { for: "tenant-choice" }, "Tenant"),
    h("div", { class: "row" }, input, h("button", { type: "submit", class: "primary" }, "Show this tenant")),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (input.value.trim()) chosen(input.value.trim());
  });
  return form;
}

/// Announces `text` to screen readers (and shows it in the status line).
export function announce(text) {
  const status = document.getElementById("status");
  if (status) status.textContent = text;
}

/// A definition list from `[label, value]` pairs (values may be nodes).
export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.filter(([, value]) => value !== undefined).map(([label, value]) => [h("dt", {}, label), h("dd", {}, value ?? "—")]),
  );
}

/// A collapsed block with the raw JSON, one click away.
export function rawJson(value, label = "Raw JSON") {
  return h("details", { class: "raw" }, h("summary", {}, label), h("pre", {}, JSON.stringify(value, null, 2)));
}

/// An id short enough for a table cell. Operation and attempt ids are time-ordered (UUIDv7), so
/// ids made in the same minute share their beginning: the end tells them apart.
export function shortId(id) {
  return id.length > 12 ? `…${id.slice(-8)}` : id;
}

/// A link inside the console (hash routes, so no id ever reaches the server's logs in a path).
export function link(route, text, attributes = {}) {
  return h("a", { href: `#/${route}`, ...attributes }, text);
}

/// The page title (h1) and the document's title, and focus on the title so keyboard and screen
/// reader users start at the new page.
export function pageTitle(text) {
  document.title = `${text} · opledger console`;
  return h("h1", { tabindex: "-1", id: "page-title" }, text);
}

/// Columns a person chooses for a listing, kept in the URL's `cols` (comma-separated keys, e.g.
/// `arg:title,owner,tenant,age`) so a view is shared by its link and nothing is remembered behind
/// the person's back. `arg:NAME` shows an argument's value; the others are the page's own keys.
export function chosenColumns(query, defaults) {
  const text = query.get("cols");
  const keys = (text === null ? defaults : text.split(","))
    .map((key) => key.trim())
    .filter((key) => key && (!key.startsWith("arg:") || key.length > 4));
  return [...new Set(keys)].slice(0, 12);
}

/// The argument names the chosen columns show, for the listing's `args=`.
export function argumentColumns(columns) {
  return columns.filter((key) => key.startsWith("arg:")).map((key) => key.slice(4));
}

/// The "Columns" form of a listing: a box per column of `available` ({key: label}) and a field
/// for an argument column; applying it writes `cols` into the URL of `route` (keeping the rest of
/// `query` but the page cursor).
export function columnPicker(route, query, available, columns) {
  const argument = columns.find((key) => key.startsWith("arg:"))?.slice(4) ?? "";
  const boxes = Object.entries(available).map(([key, label]) =>
    h("span", { class: "choice inline" }, h("input", { type: "checkbox", id: `col-${key}`, name: "col", value: key, checked: columns.includes(key) }), h("label", { for: `col-${key}` }, label, h("span", { class: "visually-hidden" }, " column"))),
  );
  const argField = h("input", { id: "col-arg", name: "col-arg", type: "text", value: argument, placeholder: "e.g. title", autocomplete: "off", "aria-describedby": "col-arg-help" });
  const form = h(
    "form",
    { class: "columns", "aria-label": "Columns" },
    h("fieldset", {}, h("legend", {}, "Show these columns"), boxes),
    h("div", { class: "field" }, h("label", { for: "col-arg" }, "Argument column"), argField, h("p", { class: "help", id: "col-arg-help" }, "An argument's name (title, amount, …): its value is shown in the first column.")),
    h("button", { type: "submit" }, "Apply columns"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = [];
    if (argField.value.trim()) chosen.push(`arg:${argField.value.trim()}`);
    for (const box of form.querySelectorAll("input[name=col]:checked")) chosen.push(box.value);
    const next = new URLSearchParams(query);
    next.delete("after");
    next.set("cols", chosen.join(","));
    location.hash = `#/${route}?${next}`;
  });
  return h("details", { class: "card column-picker" }, h("summary", {}, "Columns"), form);
}

/// A chosen argument's value for a table cell: text as it is, anything else as JSON, long values
/// cut (the operation's page shows them whole).
export function argumentCell(value) {
  if (value === undefined || value === null) return "—";
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text.length > 80 ? `${text.slice(0, 79)}…` : text;
}
