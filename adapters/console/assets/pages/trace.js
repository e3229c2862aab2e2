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

function chain(trace) {
  const events = trace.events ?? [];
  const steps = [];
  steps.push(node("source", "Source delivery", trace.source_id ?? "none given", trace.source_id ? "the tool call or message that asked" : "recorded without a source id"));
  const intent = events.find((e) => e.type === "IntentRecorded");
  steps.push(node("operation", "Operation", h("span", {}, link(`operation/${trace.operation_id}`, trace.operation_id)), `${trace.action} at ${trace.provider} / ${trace.account} · recorded ${time(intent?.data?.at)}`));
  for (const started of events.filter((e) => e.type === "AttemptStarted")) {
    const attempt = started.data.attempt_id;
    const end = events.find((e) => e.data?.attempt_id === attempt && e.type !== "AttemptStarted");
    const kind = end?.type === "AttemptSucceeded" ? "ok" : end?.type === "AttemptRejected" ? "bad" : end ? "warn" : "busy";
    const what = end ? `${end.type}${end.data.external_id ? ` · object ${end.data.external_id}` : ""}${end.data.error ? ` · ${end.data.error}` : ""}` : "no outcome recorded yet";
    steps.push(node(`attempt ${kind}`, `Attempt #${started.data.attempt_number}`, attempt, `${time(started.data.at)}${end ? ` · took ${between(started.data.at, end.data.at)}` : ""} · ${what}`, trace.query === attempt));
  }
  const lookups = events.filter((e) => e.type === "ReconciliationRecorded");
  if (lookups.length) {
    const found = lookups.find((e) => e.data.result?.kind === "found");
    steps.push(node(`lookup ${found ? "ok" : "warn"}`, `Lookups (${lookups.length})`, found ? "found the object" : "found nothing conclusive", lookups.at(-1).data.evidence));
  }
  const decision = events.find((e) => e.type === "ReviewResolved");
  if (decision) steps.push(node("decision", "A person decided", decision.data.decision ?? "", decision.data.note ?? ""));
  const outcomeKind = trace.state === "succeeded" ? "ok" : ["rejected", "denied", "abandoned"].includes(trace.state) ? "bad" : "warn";
  steps.push(node(`outcome ${outcomeKind}`, "Outcome", h("span", {}, badge(trace.state), trace.external_id ? ` object ${trace.external_id}` : ""), trace.message, trace.query === trace.external_id));
  for (const duplicate of trace.duplicates ?? []) {
    steps.push(node("duplicate bad", "Duplicate detected", JSON.stringify(duplicate), "a second object for this one request"));
  }
  const picture = h("ol", { class: "chain", "aria-label": "The chain, from the source delivery to the outcome" }, steps);
  return [
    picture,
    (trace.other_matches ?? []).length ? h("p", { class: "muted" }, `The id also matches: ${trace.other_matches.join(", ")}`) : null,
    h("p", {}, link(`operation/${trace.operation_id}`, "Every event of this operation, in order")),
  ].filter(Boolean);
}

function node(kind, label, value, detail, matched = false) {
  return h("li", { class: `node node-${kind.split(" ")[0]} tone-${kind.split(" ")[1] ?? "plain"}${matched ? " matched" : ""}` }, h("span", { class: "node-label" }, label, matched ? " (your id)" : ""), h("span", { class: "node-value" }, value), h("span", { class: "node-detail" }, detail));
}
