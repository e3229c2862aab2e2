// Trace search: any id (operation, attempt, external object, source) to the whole chain behind
// it, drawn as a picture: source delivery → operation → attempts → lookups → outcome, with
// duplicates flagged.

import { get } from "../api.js";
import { badge, between, errorBox, h, link, pageTitle, time } from "../ui.js";

export async function render(main, { id }) {
  const input = h("input", { id: "trace-id", name: "id", type: "search", value: id ?? "", autocomplete: "off", required: true, "aria-describedby": "trace-help" });
  const form = h(
    "form",
    { class: "card search", role: "search" },
    h("label", { for: "trace-id" }, "Any id"),
    h("div", { class: "row" }, input, h("button", { type: "submit", class: "primary" }, "Trace")),
    h("p", { id: "trace-help", class: "help" }, "An operation id, an attempt id, the CRM's object id (e.g. a task number) or the source id of the tool call or message."),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (input.value.trim()) location.hash = `#/trace/${encodeURIComponent(input.value.trim())}`;
  });
  const result = h("div", { "aria-live": "polite" });
  main.append(pageTitle("Trace"), form, result);
  if (!id) return null;
  try {
    result.replaceChildren(...chain(await get(`/v1/trace/${encodeURIComponent(id)}`)));
  } catch (error) {
    result.replaceChildren(errorBox(error, null));
  }
  return null;
}

/// The chain in the order things happened: the source, the operation, then each attempt, run of
/// lookups, person's decision, approval and duplicate as it came, and the outcome last.
function chain(trace) {
  const events = trace.events ?? [];
  const intent = events.find((e) => e.type === "IntentRecorded");
  const steps = [
    node("source", "Source delivery", trace.source_id ?? "none given", trace.source_id ? "the tool call or message that asked" : "recorded without a source id", trace.query === trace.source_id),
    node("operation", "Operation", link(`operation/${trace.operation_id}`, trace.operation_id), `${trace.action} at ${trace.provider} / ${trace.account} · recorded ${time(intent?.data?.at)}`, trace.query === trace.operation_id),
  ];
  let lookups = [];
  const flushLookups = () => {
    if (!lookups.length) return;
    const found = lookups.find((e) => e.data.result?.kind === "found");
    steps.push(node(`lookup ${found ? "ok" : "warn"}`, `Lookups (${lookups.length})`, found ? "found the object" : "found nothing conclusive", `${time(lookups[0].data.at)} to ${time(lookups.at(-1).data.at)} · ${lookups.at(-1).data.evidence}`));
    lookups = [];
  };
  for (const event of events) {
    if (event.type === "ReconciliationRecorded") {
      lookups.push(event);
      continue;
    }
    const step = stepOf(event, events, trace);
    if (step) {
      flushLookups();
      steps.push(step);
    }
  }
  flushLookups();
  const outcomeKind = trace.state === "succeeded" ? "ok" : ["rejected", "denied", "abandoned"].includes(trace.state) ? "bad" : "warn";
  steps.push(node(`outcome ${outcomeKind}`, "Outcome", h("span", {}, badge(trace.state), trace.external_id ? ` object ${trace.external_id}` : ""), trace.message, trace.query === trace.external_id));
  return [
    h("ol", { class: "chain", "aria-label": "The chain, from the source delivery to the outcome" }, steps),
    (trace.other_matches ?? []).length ? h("p", { class: "muted" }, `The id also matches: ${trace.other_matches.join(", ")}`) : null,
    h("p", {}, link(`operation/${trace.operation_id}`, "Every event of this operation, in order")),
  ].filter(Boolean);
}

// The token that made a decision, beside the name written with it (absent from older events).
function decidedWith(data) {
  const principal = data.principal;
  if (!principal) return "";
  const kind = principal.kind === "tenant_token" ? "tenant" : principal.kind;
  return ` (with the ${kind} token ${principal.name})`;
}

/// The chain's node for one event, or null for events that are part of another node (an
/// attempt's outcome belongs to its attempt) or carry nothing to draw (a claimed lookup).
function stepOf(event, events, trace) {
  const data = event.data ?? {};
  switch (event.type) {
    case "AttemptStarted": {
      const end = events.find((e) => e.data?.attempt_id === data.attempt_id && e.type !== "AttemptStarted");
      const kind = end?.type === "AttemptSucceeded" ? "ok" : end?.type === "AttemptRejected" ? "bad" : end ? "warn" : "busy";
      const what = end ? `${end.type}${end.data.external_id ? ` · object ${end.data.external_id}` : ""}${end.data.error ? ` · ${end.data.error}` : ""}` : "no outcome recorded yet";
      return node(`attempt ${kind}`, `Attempt #${data.attempt_number}`, data.attempt_id, `${time(data.at)}${end ? ` · took ${between(data.at, end.data.at)}` : ""} · ${what}`, trace.query === data.attempt_id);
    }
    case "ApprovalGranted":
      return node("decision ok", "Approved", `${data.approver ?? ""}${decidedWith(data)}`, time(data.at));
    case "ApprovalDenied":
      return node("decision bad", "Denied", `${data.approver ?? ""}${decidedWith(data)}`, data.reason ?? "");
    case "ReviewResolved": {
      const decided = data.decision?.kind === "confirm_succeeded" ? `confirmed object ${data.decision.external_id}` : (data.decision?.kind ?? "decided");
      const risk = data.accept_duplicate_risk ? " · accepted the duplicate risk" : "";
      return node("decision", "A person decided", `${data.reviewer ?? "a reviewer"}${decidedWith(data)}: ${decided}${risk}`, `${time(data.at)} · “${data.note ?? ""}”`);
    }
    case "DuplicateDetected":
      return node("duplicate bad", "Duplicate detected", `object ${data.duplicate_external_id}`, `a second object for this one request (confirmed: ${data.confirmed_external_id}); found by ${data.found_by}`, trace.query === data.duplicate_external_id);
    default:
      return null;
  }
}

function node(kind, label, value, detail, matched = false) {
  return h("li", { class: `node node-${kind.split(" ")[0]} tone-${kind.split(" ")[1] ?? "plain"}${matched ? " matched" : ""}` }, h("span", { class: "node-label" }, label, matched ? " (your id)" : ""), h("span", { class: "node-value" }, value), h("span", { class: "node-detail" }, detail));
}
