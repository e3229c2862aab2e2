// Outcome webhooks, for operators: each subscribed endpoint with what its delivery is doing, how
// far behind it is and its counts; pause, resume and replay; and one endpoint's delivery attempts
// (when, the answer, how long, what went wrong), newest first. The same routes as any client:
// GET /v1/webhooks, POST /v1/webhooks/{id}/pause|resume|replay, GET /v1/webhooks/{id}/attempts.

import { get, post } from "../api.js";
import { announce, duration, errorBox, facts, h, link, pageTitle, rawJson, time } from "../ui.js";

/// The most attempts one endpoint's page lists (the API keeps 10,000 per endpoint).
const ATTEMPTS_SHOWN = 200;

export async function render(main, { id }) {
  return id ? renderAttempts(main, id) : renderEndpoints(main);
}

async function renderEndpoints(main) {
  const list = h("div", { "aria-busy": "true" });
  main.append(
    pageTitle("Webhooks"),
    h("p", { class: "lead" }, "Services that receive outcome events by URL. Each endpoint gets its events one at a time, in the ledger's order, signed; a failing one is retried with growing pauses, and only that endpoint waits."),
    list,
  );
  const show = async () => {
    try {
      const { endpoints } = await get("/v1/webhooks");
      list.replaceChildren(...(endpoints.length ? endpoints.map((endpoint) => card(endpoint, show)) : [h("p", { class: "empty card" }, "No webhook endpoint is configured (or none whose tenants this token sees). They are added as [[webhooks]] entries in the server's configuration.")]));
    } catch (error) {
      list.replaceChildren(errorBox(error, show));
    }
    list.setAttribute("aria-busy", "false");
  };
  await show();
  return null;
}

function card(endpoint, refresh) {
  const key = endpoint.id;
  const result = h("div", { "aria-live": "polite" });
  const act = async (verb, body) => {
    try {
      await post(`/v1/webhooks/${encodeURIComponent(key)}/${verb}`, body);
      announce(`${key}: ${verb} done`);
      await refresh();
    } catch (error) {
      result.replaceChildren(errorBox(error, null));
    }
  };
  const from = h("input", { id: `replay-from-${key}`, type: "text", autocomplete: "off", placeholder: "e.g. 0, 1520 or 2026-12-01T00:00:00Z", "aria-describedby": `replay-help-${key}` });
  const replay = h(
    "form",
    { class: "row", novalidate: true },
    h("label", { for: `replay-from-${key}` }, "Deliver again from"),
    from,
    h("button", { type: "submit" }, "Replay"),
  );
  replay.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = from.value.trim();
    if (/^\d+$/.test(text)) act("replay", { after_position: Number(text) });
    else if (text && !Number.isNaN(Date.parse(text))) act("replay", { since: text });
    else result.replaceChildren(h("p", { class: "error", role: "alert" }, "Give a log position (0 for the very beginning) or a time such as 2026-12-01T00:00:00Z."));
  });
  const status = endpoint.status;
  return h(
    "article",
    { class: "card webhook", "data-endpoint": key, "aria-labelledby": `endpoint-${key}` },
    h("h2", { id: `endpoint-${key}` }, key, " ", h("span", { class: `badge badge-${status === "active" ? "ok" : status === "paused" ? "warn" : "bad"}` }, status)),
    facts([
      ["URL", h("code", {}, endpoint.url)],
      ["Events", endpoint.events.join(", ")],
      ["Tenants", endpoint.tenants ? endpoint.tenants.join(", ") : "every tenant"],
      ["Delivery", deliveryText(endpoint)],
      ["Behind by", `${endpoint.lag_positions} log positions`],
      ["Delivered since start", String(endpoint.delivered_total)],
      ["Failed attempts since start", String(endpoint.failed_attempts_total)],
      ["Last error", endpoint.last_error ?? undefined],
    ]),
    h(
      "div",
      { class: "actions" },
      status === "active"
        ? h("button", { type: "button", onclick: () => act("pause") }, "Pause deliveries")
        : h("button", { type: "button", class: "primary", onclick: () => act("resume") }, status === "disabled" ? "Resume (the failed event comes first)" : "Resume deliveries"),
      link(`webhooks/${encodeURIComponent(key)}`, "Delivery attempts"),
    ),
    replay,
    h("p", { id: `replay-help-${key}`, class: "help" }, "Replay delivers the events after that position (or committed since that time) again, with the same webhook-id as before, so a receiver that deduplicates takes each once."),
    result,
    rawJson(endpoint),
  );
}

/// What the endpoint's delivery is doing. The journal's status decides first: right after a
/// pause the task may still be in its retry pause, and will not send when it wakes.
function deliveryText({ status, reason, delivery }) {
  if (status === "paused") return reason ?? "paused by an operator";
  if (status === "disabled") return `disabled${reason ? `: ${reason}` : ""}`;
  switch (delivery?.state) {
    case "delivering":
      return "following the log";
    case "retrying":
      return `retrying the event at position ${delivery.position} in ${duration(delivery.retry_in_ms)} (${delivery.consecutive_failures} failed in a row)`;
    case "paused":
      return "paused by an operator";
    case "standby":
      return `standing by: ${delivery.holder ?? "another instance"} holds the lease and delivers it`;
    case "disabled":
      return `disabled: ${delivery.reason}`;
    case "faulted":
      return `stopped by a fault, starting again in ${duration(delivery.retry_in_ms)}: ${delivery.error}`;
    case "finished":
      return "stopped (the server is shutting down)";
    default:
      return delivery?.state ?? "—";
  }
}

async function renderAttempts(main, id) {
  const table = h("div", { "aria-busy": "true" });
  main.append(pageTitle(`Webhook ${id}: delivery attempts`), h("p", {}, link("webhooks", "All webhook endpoints")), table);
  try {
    const { attempts } = await get(`/v1/webhooks/${encodeURIComponent(id)}/attempts?limit=${ATTEMPTS_SHOWN}`);
    table.replaceChildren(
      attempts.length
        ? h(
            "table",
            { class: "listing stacking attempts" },
            h("caption", { class: "visually-hidden" }, `Delivery attempts to ${id}, newest first`),
            h("thead", {}, h("tr", {}, ["When", "Position", "webhook-id", "Try", "Answer", "Took", "What went wrong"].map((label) => h("th", { scope: "col" }, label)))),
            h(
              "tbody",
              {},
              attempts.map((attempt) =>
                h(
                  "tr",
                  { class: attempt.error ? "failed" : "" },
                  h("td", { "data-label": "When" }, time(attempt.at)),
                  h("td", { "data-label": "Position" }, String(attempt.position)),
                  h("td", { "data-label": "webhook-id" }, h("code", {}, attempt.webhook_id)),
                  h("td", { "data-label": "Try" }, `#${attempt.attempt}`),
                  h("td", { "data-label": "Answer" }, attempt.status === null ? "no answer" : `HTTP ${attempt.status}`),
                  h("td", { "data-label": "Took" }, duration(attempt.duration_ms)),
                  h("td", { "data-label": "What went wrong" }, attempt.error ?? "delivered"),
                ),
              ),
            ),
          )
        : h("p", { class: "empty card" }, "No delivery attempt yet."),
    );
  } catch (error) {
    table.replaceChildren(errorBox(error, null));
  }
  table.setAttribute("aria-busy", "false");
  return null;
}
