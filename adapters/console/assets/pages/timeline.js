// An operation's timeline: every event of its stream in order, in words, with its time, the time
// since the step before and since the intent, and the raw JSON one click away. New events arrive
// at the bottom over the live feed, so nothing the reader is looking at moves.

import { ApiError, get } from "../api.js";
import { badge, duration, errorBox, facts, h, link, pageTitle, rawJson, time } from "../ui.js";

/// What each stored event type means, in a few words a person reads.
const WORDS = {
  IntentRecorded: "Request recorded",
  ApprovalGranted: "Approved",
  ApprovalDenied: "Denied",
  AttemptStarted: "Sending",
  AttemptSucceeded: "Confirmed by the provider",
  AttemptRejected: "Refused by the provider",
  OutcomeUnknown: "Answer lost: outcome unknown",
  AttemptNotSent: "Not sent",
  SendPostponed: "Waiting: not sent yet",
  LeaseExpired: "Sender vanished: outcome unknown",
  LookupClaimed: "Looking it up",
  LookupPostponed: "Waiting: not looked up yet",
  ReconciliationRecorded: "Lookup result",
  RetryScheduled: "Retry scheduled",
  ReviewRequired: "Handed to a person",
  ReviewResolved: "A person decided",
  LateResponseReceived: "Late answer",
  DuplicateDetected: "Duplicate detected",
};

export async function render(main, { id }, context) {
  if (!id) {
    location.hash = "#/operations";
    return null;
  }
  const head = h("div", { "aria-busy": "true" });
  const list = h("ol", { class: "timeline", "aria-label": "Events, oldest first" });
  const deliveries = h("section", { class: "card deliveries", "aria-labelledby": "deliveries-heading", "aria-busy": "true" });
  main.append(h("p", {}, link("operations", "← Operations")), pageTitle("Operation timeline"), head, list, deliveries);
  showDeliveries(deliveries, id);
  let shown = 0;
  const load = async () => {
    try {
      const [operation, history] = await Promise.all([get(`/v1/operations/${encodeURIComponent(id)}`), get(`/v1/operations/${encodeURIComponent(id)}/events`)]);
      head.replaceChildren(summary(operation));
      head.setAttribute("aria-busy", "false");
      const start = history.events[0]?.data?.at;
      // Append only what is new: rows already shown never move or re-render.
      for (let i = shown; i < history.events.length; i++) {
        const event = history.events[i];
        const previous = history.events[i - 1]?.data?.at ?? event.data.at;
        list.append(row(event, history.timeline?.[i], previous, start));
      }
      shown = history.events.length;
    } catch (error) {
      head.replaceChildren(errorBox(error, load));
    }
  };
  await load();
  // One load at a time: two overlapping loads would both append the same new rows. Events that
  // arrive during a load ask for one more after it.
  let loading = null;
  let again = false;
  const reload = () => {
    if (loading) {
      again = true;
      return;
    }
    loading = load().finally(() => {
      loading = null;
      if (again) {
        again = false;
        reload();
      }
    });
  };
  return context.onEvent((event) => {
    if (event.data.operation_id === id) reload();
  });
}

function summary(operation) {
  return h(
    "section",
    { class: "card summary" },
    h("p", { class: "big" }, badge(operation.state), " ", operation.message),
    facts([
      ["Operation", operation.operation_id],
      ["Tenant", operation.tenant],
      ["Owner", operation.owner ?? "none recorded"],
      ["Provider / account", `${operation.provider} / ${operation.account}`],
      ["Action", operation.action],
      ["External id", operation.external_id],
      ["Attempts", String(operation.attempts)],
      ["Source id", operation.source_id],
      ["Version", String(operation.version)],
    ]),
    h("p", {}, link(`trace/${operation.operation_id}`, "Draw its chain"), operation.state === "needs_review" || operation.state === "unknown" ? [" · ", link(`review/${operation.operation_id}`, "Decide")] : null),
  );
}

function row(event, line, previous, start) {
  const at = event.data?.at;
  const sincePrevious = at && previous ? new Date(at) - new Date(previous) : null;
  const sinceStart = at && start ? new Date(at) - new Date(start) : null;
  return h(
    "li",
    { class: `event event-${event.type}`, "data-type": event.type },
    h("div", { class: "event-time" }, h("time", { datetime: at ?? "" }, time(at)), h("span", { class: "muted" }, sincePrevious === null ? "" : `+${duration(sincePrevious)} · at ${duration(sinceStart)}`)),
    h("div", { class: "event-body" }, h("p", { class: "event-title" }, WORDS[event.type] ?? event.type, h("span", { class: "muted" }, ` · ${event.type} · v${event.version}`)), h("p", {}, readable(line) ?? ""), rawJson(event)),
  );
}

/// The summary part of the API's own timeline line ("@18 v0 + 0 ms IntentRecorded <summary>").
function readable(line) {
  if (!line) return null;
  const match = /^@\d+\s+v\d+\s+\+\s*\d+ ms\s+\S+\s+(.*)$/.exec(line);
  return match ? match[1] : line;
}

/// The operation's webhook deliveries: for each endpoint and event, how many attempts, whether
/// one got through, the last answer and error; and the endpoints that have not reached its newest
/// event yet. A token that may not read them (an approver's) is told so in one line.
async function showDeliveries(section, id) {
  const title = h("h2", { id: "deliveries-heading" }, "Webhook deliveries");
  try {
    const answer = await get(`/v1/operations/${encodeURIComponent(id)}/deliveries`);
    const behind = answer.endpoints.filter((endpoint) => endpoint.behind);
    // replaceChildren would write a null as the text "null": leave the missing ones out.
    section.replaceChildren(
      ...[
      title,
      answer.deliveries.length
        ? h(
            "div",
            { class: "scroll", tabindex: "0", role: "region", "aria-label": "Webhook deliveries" },
            h(
              "table",
              { class: "listing stacking" },
              h("thead", {}, h("tr", {}, ["Endpoint", "Event", "Attempts", "Status", "Last answer", "Last error", "Last attempt"].map((x) => h("th", { scope: "col" }, x)))),
              h(
                "tbody",
                {},
                answer.deliveries.map((d) =>
                  h(
                    "tr",
                    { class: d.delivered ? "" : "failed", "data-endpoint": d.endpoint },
                    h("td", { "data-label": "Endpoint" }, link(`webhooks/${encodeURIComponent(d.endpoint)}`, d.endpoint)),
                    h("td", { "data-label": "Event" }, `${WORDS[d.event_type] ?? d.event_type ?? "?"} (position ${d.position})`),
                    h("td", { "data-label": "Attempts" }, String(d.attempts)),
                    h("td", { "data-label": "Status" }, h("span", { class: `badge badge-${d.delivered ? "ok" : "bad"}` }, d.delivered ? "delivered" : "failing")),
                    h("td", { "data-label": "Last answer" }, d.last_status === null ? "no answer" : `HTTP ${d.last_status}`),
                    h("td", { "data-label": "Last error" }, d.last_error ?? "—"),
                    h("td", { "data-label": "Last attempt" }, time(d.last_at)),
                  ),
                ),
              ),
            ),
          )
        : h("p", { class: "muted" }, answer.endpoints.length ? "No delivery attempt for this operation's events yet." : "No webhook endpoint receives this operation's events."),
      behind.length ? h("p", { class: "muted" }, `Not yet through this operation's newest event: ${behind.map((e) => `${e.id} (${e.status})`).join(", ")}.`) : null,
      ].filter(Boolean),
    );
  } catch (error) {
    section.replaceChildren(title, h("p", { class: "muted" }, error instanceof ApiError && error.status === 403 ? "This token may not read webhook deliveries." : error.message));
  }
  section.setAttribute("aria-busy", "false");
}
