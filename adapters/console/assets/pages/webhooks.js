// Outcome webhooks, for operators: each subscribed endpoint with what its delivery is doing, how
// far behind it is and its counts; pause, resume and replay (confirmed first); a test event;
// endpoints defined, rotated and deleted here without a restart; and one endpoint's delivery
// attempts (when, the answer, how long, what went wrong), newest first. The same routes as any
// client: GET|POST /v1/webhooks, PATCH|DELETE /v1/webhooks/{id},
// POST /v1/webhooks/{id}/pause|resume|replay|test|rotate-secret, GET /v1/webhooks/{id}/attempts.

import { call, get, post } from "../api.js";
import { announce, duration, errorBox, facts, h, link, pageTitle, rawJson, shortId, time } from "../ui.js";

/// The most attempts one endpoint's page lists (the API keeps 10,000 per endpoint).
const ATTEMPTS_SHOWN = 200;

export async function render(main, { id }) {
  return id ? renderAttempts(main, id) : renderEndpoints(main);
}

async function renderEndpoints(main) {
  const list = h("div", { "aria-busy": "true" });
  const shown = h("div", { "aria-live": "polite" });
  main.append(
    pageTitle("Webhooks"),
    h("p", { class: "lead" }, "Services that receive outcome events by URL. Each endpoint gets its events one at a time, in the ledger's order, signed; a failing one is retried with growing pauses, and only that endpoint waits."),
    list,
    newEndpointForm(shown, () => show()),
    shown,
  );
  const show = async () => {
    try {
      const { endpoints } = await get("/v1/webhooks");
      list.replaceChildren(...(endpoints.length ? endpoints.map((endpoint) => card(endpoint, show)) : [h("p", { class: "empty card" }, "No webhook endpoint yet (or none whose tenants this token sees). Add one below, or as a [[webhooks]] entry in the server's configuration.")]));
    } catch (error) {
      list.replaceChildren(errorBox(error, show));
    }
    list.setAttribute("aria-busy", "false");
  };
  await show();
  return null;
}

/// The form that defines an endpoint through the API; its secret is shown once, here.
function newEndpointForm(shown, refresh) {
  const field = (id, label, attributes, help) => [
    h("label", { for: id }, label),
    h("input", { id, type: "text", autocomplete: "off", ...attributes, ...(help ? { "aria-describedby": `${id}-help` } : {}) }),
    help ? h("p", { id: `${id}-help`, class: "help" }, help) : null,
  ];
  const form = h(
    "form",
    { class: "card new-endpoint", novalidate: true, "aria-labelledby": "new-endpoint-title" },
    h("h2", { id: "new-endpoint-title" }, "Add an endpoint"),
    ...field("new-endpoint-id", "Name", { placeholder: "e.g. billing" }, "Letters, digits, - or _."),
    ...field("new-endpoint-url", "URL", { placeholder: "the receiver's HTTPS URL" }, "An HTTPS URL, or plain HTTP to this machine only. Private network addresses are refused."),
    ...field("new-endpoint-events", "Events", { value: "succeeded, needs_review" }, "Comma-separated: succeeded, rejected, unknown, needs_review, duplicate_detected … or all."),
    ...field("new-endpoint-tenants", "Tenants", { placeholder: "every tenant" }, "Comma-separated; leave empty for every tenant your token covers."),
    h("button", { type: "submit", class: "primary" }, "Add endpoint"),
  );
  const list = (id) =>
    form
      .querySelector(`#${id}`)
      .value.split(",")
      .map((part) => part.trim())
      .filter(Boolean);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const tenants = list("new-endpoint-tenants");
    const body = {
      id: form.querySelector("#new-endpoint-id").value.trim(),
      url: form.querySelector("#new-endpoint-url").value.trim(),
      events: list("new-endpoint-events"),
      ...(tenants.length ? { tenants } : {}),
    };
    try {
      const created = await post("/v1/webhooks", body);
      shown.replaceChildren(secretNote(created.id, created.secret, "added"));
      announce(`${created.id} added`);
      form.reset();
      await refresh();
    } catch (error) {
      shown.replaceChildren(errorBox(error, null));
    }
  });
  return form;
}

/// A secret handed over once, to copy into the receiver's configuration.
function secretNote(id, secret, what) {
  return h(
    "div",
    { class: "card notice", role: "status" },
    h("p", {}, `${id} ${what}. Its signing secret is shown this once; put it in the receiver's configuration:`),
    h("p", {}, h("code", { class: "secret" }, secret)),
  );
}

function card(endpoint, refresh) {
  const key = endpoint.id;
  const path = `/v1/webhooks/${encodeURIComponent(key)}`;
  const result = h("div", { "aria-live": "polite" });
  const act = async (verb, body, said) => {
    try {
      const answer = await post(`${path}/${verb}`, body);
      const text = said ? said(answer) : `${key}: ${verb} done`;
      announce(text);
      await refresh();
      document.querySelector(`[data-endpoint="${CSS.escape(key)}"] [aria-live]`)?.replaceChildren(h("p", { class: "done", role: "status" }, text));
    } catch (error) {
      result.replaceChildren(errorBox(error, null));
    }
  };
  /// A second click confirms: the button says what is about to happen, and another way out.
  const confirmed = (button, question, run) => {
    button.addEventListener("click", () => {
      const yes = h("button", { type: "button", class: "primary" }, "Yes, do it");
      const no = h("button", { type: "button" }, "Cancel");
      yes.addEventListener("click", () => {
        result.replaceChildren();
        run();
      });
      no.addEventListener("click", () => result.replaceChildren());
      result.replaceChildren(h("div", { class: "confirm", role: "alertdialog", "aria-label": question }, h("p", {}, question), yes, no));
      yes.focus();
    });
    return button;
  };
  const from = h("input", { id: `replay-from-${key}`, type: "text", autocomplete: "off", placeholder: "e.g. 0, 1520 or 2026-12-01T00:00:00Z", "aria-describedby": `replay-help-${key}` });
  const replay = h(
    "form",
    { class: "row", novalidate: true },
    h("label", { for: `replay-from-${key}` }, "Deliver again from"),
    from,
    h("button", { type: "submit" }, "Replay"),
  );
  const replayed = (answer) => `${key}: replaying from position ${answer.checkpoint ?? 0}; ${answer.lag_positions} log positions to go through again`;
  replay.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = from.value.trim();
    let body;
    let what;
    if (/^\d+$/.test(text)) [body, what] = [{ after_position: Number(text) }, Number(text) === 0 ? "every event from the beginning" : `every event after position ${text}`];
    else if (text && !Number.isNaN(Date.parse(text))) [body, what] = [{ since: text }, `every event since ${text}`];
    else return result.replaceChildren(h("p", { class: "error", role: "alert" }, "Give a log position (0 for the very beginning) or a time such as 2026-12-01T00:00:00Z."));
    const yes = h("button", { type: "button", class: "primary" }, "Yes, deliver again");
    const no = h("button", { type: "button" }, "Cancel");
    yes.addEventListener("click", () => act("replay", body, replayed));
    no.addEventListener("click", () => result.replaceChildren());
    result.replaceChildren(h("div", { class: "confirm", role: "alertdialog", "aria-label": "Confirm the replay" }, h("p", {}, `Deliver ${what} to ${key} again?`), yes, no));
    yes.focus();
  });
  const status = endpoint.status;
  const health = badgeOf(endpoint);
  const managed = endpoint.source === "api";
  const rotate = confirmed(h("button", { type: "button" }, "Rotate secret"), `Make a new secret for ${key}? The current one keeps signing beside it for 24 hours, so the receiver can switch without losing a delivery.`, async () => {
    try {
      const rotated = await post(`${path}/rotate-secret`, {});
      result.replaceChildren(secretNote(key, rotated.secret, "has a new secret"));
    } catch (error) {
      result.replaceChildren(errorBox(error, null));
    }
  });
  const remove = confirmed(h("button", { type: "button", class: "danger" }, "Delete endpoint"), `Delete ${key}? Deliveries to it stop at once.`, async () => {
    try {
      await call("DELETE", path);
      announce(`${key} deleted`);
      await refresh();
    } catch (error) {
      result.replaceChildren(errorBox(error, null));
    }
  });
  return h(
    "article",
    { class: "card webhook", "data-endpoint": key, "aria-labelledby": `endpoint-${key}` },
    h("h2", { id: `endpoint-${key}` }, key, " ", h("span", { class: `badge badge-${health.tone}` }, health.text)),
    facts([
      ["URL", h("code", {}, endpoint.url)],
      ["Defined in", managed ? "the API (change it here)" : "the configuration file"],
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
      h("button", { type: "button", onclick: () => act("test", {}, ({ attempt }) => `${key}: test event ${attempt.error ? `failed: ${attempt.error}` : `answered HTTP ${attempt.status}`} in ${duration(attempt.duration_ms)}`) }, "Send a test event"),
      managed ? rotate : null,
      managed ? remove : null,
      link(`webhooks/${encodeURIComponent(key)}`, "Delivery attempts"),
    ),
    replay,
    h("p", { id: `replay-help-${key}`, class: "help" }, "Replay delivers the events after that position (or committed since that time) again, with the same webhook-id as before, so a receiver that deduplicates takes each once."),
    result,
    rawJson(endpoint),
  );
}

/// The badge an endpoint wears: what its delivery is doing, not only the journal's status (an
/// active endpoint retrying the same event for hours is failing, not green).
function badgeOf({ status, delivery }) {
  if (status === "paused") return { tone: "warn", text: "paused" };
  if (status === "disabled") return { tone: "bad", text: "disabled" };
  switch (delivery?.state) {
    case "retrying":
      return delivery.consecutive_failures >= 3 ? { tone: "bad", text: "failing" } : { tone: "warn", text: "retrying" };
    case "faulted":
      return { tone: "bad", text: "faulted" };
    case "standby":
      return { tone: "ok", text: "standby" };
    case "finished":
      return { tone: "warn", text: "stopped" };
    default:
      return { tone: "ok", text: "active" };
  }
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
            h("thead", {}, h("tr", {}, ["When", "Operation", "Position", "webhook-id", "Try", "Answer", "Took", "What went wrong", "Payload"].map((label) => h("th", { scope: "col" }, label)))),
            h(
              "tbody",
              {},
              attempts.map((attempt) =>
                h(
                  "tr",
                  { class: attempt.error ? "failed" : "" },
                  h("td", { "data-label": "When" }, time(attempt.at)),
                  h("td", { "data-label": "Operation" }, attempt.operation_id ? link(`operation/${attempt.operation_id}`, shortId(attempt.operation_id), { title: attempt.operation_id }) : "test event"),
                  h("td", { "data-label": "Position" }, String(attempt.position)),
                  h("td", { "data-label": "webhook-id" }, h("code", {}, attempt.webhook_id)),
                  h("td", { "data-label": "Try" }, `#${attempt.attempt}`),
                  h("td", { "data-label": "Answer" }, attempt.status === null ? "no answer" : `HTTP ${attempt.status}`),
                  h("td", { "data-label": "Took" }, duration(attempt.duration_ms)),
                  h("td", { "data-label": "What went wrong" }, attempt.error ?? "delivered"),
                  h("td", { "data-label": "Payload" }, attempt.position > 0 ? payloadButton(id, attempt.position) : "—"),
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

/// A button that reads what the endpoint is sent for the event at `position` (rendered again
/// from the log) and shows it beneath, once asked: payloads can be large, so none is fetched
/// until a person wants it.
function payloadButton(id, position) {
  const shown = h("div", { class: "payload", "aria-live": "polite" });
  const button = h("button", { type: "button", class: "small", "aria-label": `Show the payload at position ${position}` }, "Show");
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const answer = await get(`/v1/webhooks/${encodeURIComponent(id)}/payload?position=${position}`);
      shown.replaceChildren(h("pre", {}, JSON.stringify(answer.payload, null, 2)));
      button.hidden = true;
    } catch (error) {
      shown.replaceChildren(errorBox(error, null));
      button.disabled = false;
    }
  });
  return h("div", {}, button, shown);
}
