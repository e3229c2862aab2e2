// The overview: how many operations are in each state (for this token's tenants), the oldest
// unknown's age, what the reconciler confirmed, duplicates found, and how far the read models
// are behind — refreshed when the live feed says something happened, never on a timer, and at
// most once a second, so a burst of events is one refresh, not a storm.

import { get } from "../api.js";
import { STATES, badge, duration, errorBox, h, link, pageTitle, shortId, time } from "../ui.js";

/// Events refresh the numbers at most once per this many milliseconds: the first event starts the
/// wait, the ones during it ride along (a steady stream of events cannot postpone it for ever).
const REFRESH_EVERY_MS = 1000;
/// The live events the page keeps on screen.
const RECENT_EVENTS = 12;

export async function render(main, { query }, context) {
  // The tenant the numbers are for comes from the URL only: a filter the person cannot see must
  // never narrow what the overview says.
  const tenant = query.get("tenant");
  const cards = h("div", { class: "cards", "aria-busy": "true" });
  const server = h("div", { class: "cards" });
  // A fixed set of rows whose contents change: a new event rewrites the rows instead of
  // inserting one, so nothing on the page moves when events arrive.
  const slots = Array.from({ length: RECENT_EVENTS }, () => h("li", { class: "slot" }));
  slots[0].append(h("span", { class: "muted small" }, "Events appear here as they happen (from the live feed)."));
  const recent = h("ol", { class: "recent", "aria-label": "Latest outcome events, newest first" }, slots);
  const events = [];
  const failure = h("div");
  main.append(
    pageTitle("Overview"),
    scopeLine(tenant),
    failure,
    h("section", { "aria-labelledby": "states-heading" }, h("h2", { id: "states-heading" }, "Operations by state"), cards),
    h("section", { "aria-labelledby": "server-heading" }, h("h2", { id: "server-heading" }, "Reconciliation and health"), server),
    h("section", { "aria-labelledby": "recent-heading" }, h("h2", { id: "recent-heading" }, "Live outcome events"), h("div", { class: "recent-box card" }, recent)),
  );
  // Placeholders of the final size first, so the numbers arriving move nothing.
  cards.replaceChildren(...Object.keys(STATES).map((state) => stateCard(state, "…", tenant)));
  server.replaceChildren(...["Oldest unknown", "Reconciliations confirmed", "Duplicates detected", "Read-model lag"].map((label) => numberCard(label, "…")));
  // The reconciler's count is kept for the whole server only (/metrics), so it is shown to a
  // token that sees every tenant; the other numbers are the token's own scope.
  const everyTenant = (await get("/v1/whoami").catch(() => null))?.tenants === null;
  const refresh = async () => {
    try {
      const [counts, health, metrics] = await Promise.all([get(`/v1/counts${tenant ? `?tenant=${encodeURIComponent(tenant)}` : ""}`), get("/healthz").catch(() => null), everyTenant ? metricsText() : {}]);
      cards.replaceChildren(...Object.keys(STATES).map((state) => stateCard(state, String(counts.by_state[state] ?? 0), tenant)));
      cards.setAttribute("aria-busy", "false");
      const oldest = counts.oldest_unknown;
      server.replaceChildren(
        numberCard("Oldest unknown", oldest ? duration(Date.now() - Date.parse(oldest.since)) : "none", oldest ? h("span", {}, "since its answer was lost: ", link(`operation/${oldest.operation_id}`, shortId(oldest.operation_id), { title: oldest.operation_id })) : "no operation waits for its outcome"),
        numberCard("Reconciliations confirmed", everyTenant ? metrics.reconciliations ?? "—" : "—", everyTenant ? "lookups that found the object (all tenants)" : "counted for the whole server only"),
        numberCard("Duplicates detected", counts.duplicates_detected, "a second object for one request"),
        numberCard("Read-model lag", health ? `${health.read_model_lag_positions} events` : "—", health ? `${health.log_head === null || health.log_head === undefined ? "the log is empty" : `log head at position ${health.log_head}`} · ${health.status}` : "health unavailable"),
      );
      failure.replaceChildren();
    } catch (error) {
      failure.replaceChildren(errorBox(error, refresh));
    }
  };
  await refresh();
  let timer = null;
  return context.onEvent((event) => {
    events.unshift(event);
    events.length = Math.min(events.length, RECENT_EVENTS);
    events.forEach((shown, i) => slots[i].replaceChildren(...eventLine(shown)));
    timer ??= setTimeout(() => {
      timer = null;
      refresh();
    }, REFRESH_EVERY_MS);
  });
}

/// What the numbers count, and the form to count one tenant (the choice lives in the URL).
function scopeLine(tenant) {
  const input = h("input", { id: "overview-tenant", name: "tenant", type: "text", autocomplete: "off", value: tenant ?? "", placeholder: "all of yours" });
  const form = h(
    "form",
    { class: "row scope-line", role: "search", "aria-label": "Count one tenant" },
    h("p", { class: "muted" }, tenant ? `Counting tenant ${tenant} only. ` : "Counting every tenant this token sees. ", tenant ? link("overview", "Count all of them") : null),
    h("label", { for: "overview-tenant" }, "Tenant"),
    input,
    h("button", { type: "submit" }, "Count"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = input.value.trim();
    location.hash = value ? `#/overview?tenant=${encodeURIComponent(value)}` : "#/overview";
  });
  return form;
}

function eventLine(event) {
  const id = event.data.operation_id;
  return [h("time", { datetime: event.data.at }, time(event.data.at)), " ", badge(event.data.type), " ", link(`operation/${id}`, shortId(id), { title: id }), " ", h("span", { class: "muted" }, event.data.detail ?? "")];
}

/// The server-wide number from /metrics (Prometheus text); empty when a metrics token guards it.
async function metricsText() {
  const response = await fetch("/metrics", { credentials: "omit", cache: "no-store" }).catch(() => null);
  if (!response?.ok) return {};
  const text = await response.text();
  const value = (name) => {
    const match = new RegExp(`^${name} (\\S+)$`, "m").exec(text);
    return match ? Number(match[1]) : null;
  };
  return { reconciliations: value("opledger_reconciliations_confirmed_total") };
}

function stateCard(state, count, tenant) {
  const tenantLink = tenant ? `&tenant=${encodeURIComponent(tenant)}` : "";
  const [label] = STATES[state];
  return h("a", { class: `stat stat-${state}`, href: `#/operations?state=${state}${tenantLink}` }, h("span", { class: "stat-number" }, count), h("span", { class: "stat-label" }, label));
}

function numberCard(label, value, help) {
  return h("div", { class: "stat" }, h("span", { class: "stat-number" }, String(value)), h("span", { class: "stat-label" }, label), help ? h("span", { class: "muted small" }, help) : null);
}
