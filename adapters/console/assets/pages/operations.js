// Listings by state and age, with paging (the API's `next` cursor) and filters: state, age,
// tenant, provider, account, owner and an argument's value are all the listing API's own, so
// every page is filtered (a search by owner or argument reads the server's index).

import { get, needsTenant } from "../api.js";
import { STATES, argumentCell, argumentColumns, badge, chosenColumns, columnPicker, duration, errorBox, h, link, pageTitle, shortId } from "../ui.js";

/// Rows per page.
const PAGE_ROWS = 25;
/// The columns a person may choose besides the state and the operation (and an argument's).
const COLUMNS = { owner: "Owner", tenant: "Tenant", provider: "Provider / account", action: "Action", age: "Age", attempts: "Attempts", external: "External id" };
/// The columns shown while the URL names none.
const DEFAULT_COLUMNS = ["tenant", "provider", "action", "age", "external"];

export async function render(main, { query }) {
  const form = filters(query);
  const columns = chosenColumns(query, DEFAULT_COLUMNS);
  const results = h("div", { "aria-live": "polite", "aria-busy": "true" });
  main.append(pageTitle("Operations"), form, columnPicker("operations", query, COLUMNS, columns), results);
  // Newest first unless the URL asks for the oldest: what an incident adds is what is looked for.
  const params = new URLSearchParams({ limit: String(PAGE_ROWS), order: query.get("order") === "oldest" ? "oldest" : "newest" });
  for (const name of ["state", "older_than", "since", "tenant", "provider", "account", "action", "source_id", "owner", "arg", "after"]) {
    if (query.get(name)) params.set(name, query.get(name));
  }
  const shownArgs = argumentColumns(columns);
  if (shownArgs.length) params.set("args", shownArgs.join(","));
  try {
    const page = await get(`/v1/operations?${params}`);
    results.replaceChildren(listing(page.operations, columns), pager(query, page.next));
  } catch (error) {
    results.replaceChildren(needsTenant(error) ? h("p", { class: "warning", role: "alert" }, "This token sees several tenants: name one in the Tenant field above.") : errorBox(error, null));
  }
  results.setAttribute("aria-busy", "false");
  return null;
}

function filters(query) {
  const field = (name, label, control) => h("div", { class: "field" }, h("label", { for: `filter-${name}` }, label), control);
  const state = h("select", { id: "filter-state", name: "state" }, h("option", { value: "" }, "any state"), Object.entries(STATES).map(([value, [label]]) => h("option", { value, selected: query.get("state") === value }, label)));
  const text = (name, placeholder) => h("input", { id: `filter-${name}`, name, type: "text", value: query.get(name) ?? "", placeholder, autocomplete: "off" });
  const form = h(
    "form",
    { class: "filters card", role: "search", "aria-label": "Filter operations" },
    field("state", "State", state),
    field("older_than", "Older than", text("older_than", "e.g. 5m, 2h")),
    field("tenant", "Tenant", h("input", { id: "filter-tenant", name: "tenant", type: "text", value: query.get("tenant") ?? "", placeholder: "any of yours", autocomplete: "off" })),
    field("provider", "Provider", text("provider", "any")),
    field("account", "Account", text("account", "any")),
    field("action", "Action", text("action", "any")),
    field("source_id", "Source id", text("source_id", "a tool call's id")),
    field("owner", "Owner", text("owner", "whom it is for")),
    field("arg", "Argument", text("arg", "name:value, e.g. title:Call the client")),
    field("since", "Recorded since", text("since", "e.g. 2026-12-01T14:00:00Z")),
    field("order", "Order", h("select", { id: "filter-order", name: "order" }, h("option", { value: "" }, "newest first"), h("option", { value: "oldest", selected: query.get("order") === "oldest" }, "oldest first"))),
    h("button", { type: "submit" }, "Show"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const [name, value] of new FormData(form)) if (String(value).trim()) next.set(name, String(value).trim());
    // The chosen columns stay with a new search: they are the view, not the filter.
    if (query.get("cols") !== null) next.set("cols", query.get("cols"));
    location.hash = `#/operations?${next}`;
  });
  return form;
}

/// A column's heading and its cell for one operation.
function column(key) {
  if (key.startsWith("arg:")) return [key.slice(4), (op) => argumentCell(op.args?.[key.slice(4)])];
  switch (key) {
    case "owner":
      return ["Owner", (op) => op.owner ?? "—"];
    case "tenant":
      return ["Tenant", (op) => op.tenant];
    case "provider":
      return ["Provider / account", (op) => `${op.provider} / ${op.account}`];
    case "action":
      return ["Action", (op) => op.action];
    case "age":
      return ["Age", (op) => duration(op.age_s * 1000)];
    case "attempts":
      return ["Attempts", (op) => String(op.attempts)];
    case "external":
      return ["External id", (op) => op.external_id ?? "—"];
    default:
      return null;
  }
}

function listing(rows, columns) {
  if (!rows.length) return h("p", { class: "empty card" }, "No operation matches.");
  const shown = columns.map(column).filter(Boolean);
  return h(
    "div",
    { class: "scroll", tabindex: "0", role: "region", "aria-label": "Operations" },
    h(
      "table",
      { class: "listing stacking" },
      h("thead", {}, h("tr", {}, ["State", "Operation", ...shown.map(([heading]) => heading)].map((x) => h("th", { scope: "col" }, x)))),
      h(
        "tbody",
        {},
        rows.map((op) => h("tr", {}, cell("State", badge(op.state)), cell("Operation", link(`operation/${op.operation_id}`, shortId(op.operation_id), { title: op.operation_id })), shown.map(([heading, value]) => cell(heading, value(op))))),
      ),
    ),
  );
}

function cell(label, content) {
  return h("td", { "data-label": label }, content);
}

function pager(query, next) {
  const links = [];
  if (query.get("after")) {
    const first = new URLSearchParams(query);
    first.delete("after");
    links.push(h("a", { href: `#/operations?${first}` }, "← First page"));
  }
  if (next) {
    const following = new URLSearchParams(query);
    following.set("after", next);
    links.push(h("a", { href: `#/operations?${following}`, rel: "next" }, "Next page →"));
  }
  return h("nav", { class: "pager", "aria-label": "Pages" }, links);
}
