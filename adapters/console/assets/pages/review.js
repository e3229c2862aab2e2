// The review queue and the decision form: operations whose outcome nobody knows, a page at a
// time (the API's keyset cursor, so the thousandth item costs what the first does), newest first
// unless the person asks for the oldest, filtered by what the URL says (shareable, never
// remembered behind the person's back); and one item with the whole evidence a person needs to
// decide (what was asked, where, every attempt and what came back, every lookup, the reason, the
// action's deduplication contract in words), and a form that records one decision at the version
// the person looked at.

import { ApiError, get, post } from "../api.js";
import { announce, argumentCell, argumentColumns, badge, between, chosenColumns, columnPicker, duration, errorBox, facts, h, link, pageTitle, rawJson, shortId, time } from "../ui.js";

/// Queue items on one page.
const QUEUE_ROWS = 50;
/// Live events look at the queue's size at most once per this many milliseconds.
const REFRESH_EVERY_MS = 1000;
/// The filters a queue page takes from its URL, as the API names them (a bulk decision's
/// `filter` takes the same, so "every item matching" is what the page lists).
const FILTERS = ["tenant", "provider", "account", "state", "owner", "arg", "since", "until"];
/// The columns a person may choose for the queue as a table (and an argument's, `arg:NAME`).
const COLUMNS = { owner: "Owner", tenant: "Tenant", provider: "Provider / account", age: "Waiting", attempts: "Attempts" };

export async function render(main, { id, query }, context) {
  if (id) return renderItem(main, id, context);
  return renderQueue(main, query, context);
}

/// The API query of a queue page: its filters and cursor from the URL, newest first by default.
function queueParams(query, extra = {}) {
  const params = new URLSearchParams({ order: query.get("order") === "oldest" ? "oldest" : "newest" });
  for (const name of [...FILTERS, "after"]) if (query.get(name)) params.set(name, query.get(name));
  for (const [name, value] of Object.entries(extra)) params.set(name, value);
  return params;
}

async function renderQueue(main, query, context) {
  const oldest = query.get("order") === "oldest";
  // Without `cols` in the URL the queue is a list of cards with each item's evidence; with it,
  // a table of the chosen columns, read without the evidence (one row per item).
  const columns = query.get("cols") === null ? null : chosenColumns(query, []);
  const list = h("div", { class: "queue", "aria-busy": "true" });
  const summary = h("p", { class: "queue-summary", role: "status" });
  const changed = h("div", { class: "queue-changed" });
  main.append(
    pageTitle("Review queue"),
    h("p", { class: "lead" }, "Operations whose outcome opledger could not establish on its own. Open one, read the evidence, and record what should happen."),
    queueFilters(query),
    columnPicker("review", query, COLUMNS, columns ?? []),
    bulkPanel(query),
    h("div", { class: "row queue-bar" }, summary, orderToggle(query, oldest)),
    changed,
    list,
  );
  let shownTotal = null;
  try {
    const extra = { limit: String(QUEUE_ROWS), detail: columns ? "none" : "full" };
    if (columns && argumentColumns(columns).length) extra.args = argumentColumns(columns).join(",");
    const page = await get(`/v1/review?${queueParams(query, extra)}`);
    shownTotal = page.total;
    summary.textContent = summaryText(page, query);
    const shown = columns ? (page.queue.length ? [queueTable(page.queue, columns)] : []) : page.queue.map(item);
    list.replaceChildren(
      ...(page.queue.length ? shown : [h("p", { class: "empty card" }, page.total || query.get("after") ? "No more items on this page." : "Nothing waits for a person here. New cases appear in the count above by themselves.")]),
      queuePager(query, page.next),
    );
  } catch (error) {
    list.replaceChildren(errorBox(error, () => location.reload()));
  }
  list.setAttribute("aria-busy", "false");
  refreshCount();
  // Live events never rewrite the list under the person's eyes (nor fetch every item's evidence
  // again): they update the count, and say so when the queue changed.
  return context.onEvent(
    throttled(async () => {
      refreshCount();
      const now = await get(`/v1/review?${queueParams(query, { limit: "1", detail: "none" })}`).catch(() => null);
      if (!now || shownTotal === null || now.total === shownTotal) return;
      changed.replaceChildren(
        h("p", { class: "notice" }, `The queue changed: ${now.total} waiting match now (${shownTotal} when this page loaded). `, h("button", { type: "button", onclick: () => location.reload() }, "Show the current queue")),
      );
    }),
  );
}

function summaryText(page, query) {
  const where = query.get("after") ? "a later page" : "the first page";
  return `${page.total} waiting match${page.total === 1 ? "es" : ""}; ${page.queue.length} on ${where}, ${query.get("order") === "oldest" ? "oldest" : "newest"} first.`;
}

function orderToggle(query, oldest) {
  const next = new URLSearchParams(query);
  next.delete("after");
  if (oldest) next.delete("order");
  else next.set("order", "oldest");
  return h("a", { href: `#/review?${next}`, class: "button-link" }, oldest ? "Show newest first" : "Show oldest first");
}

function queueFilters(query) {
  const field = (name, label, control) => h("div", { class: "field" }, h("label", { for: `queue-${name}` }, label), control);
  const text = (name, placeholder) => h("input", { id: `queue-${name}`, name, type: "text", value: query.get(name) ?? "", placeholder, autocomplete: "off" });
  const state = h("select", { id: "queue-state", name: "state" }, h("option", { value: "" }, "either"), h("option", { value: "needs_review", selected: query.get("state") === "needs_review" }, "needs review"), h("option", { value: "unknown", selected: query.get("state") === "unknown" }, "unknown outcome"));
  const form = h(
    "form",
    { class: "filters card", role: "search", "aria-label": "Filter the review queue" },
    field("tenant", "Tenant", text("tenant", "any of yours")),
    field("provider", "Provider", text("provider", "any")),
    field("account", "Account", text("account", "any")),
    field("state", "State", state),
    field("arg", "Title or argument", text("arg", "name:value, e.g. title:Call the client")),
    field("owner", "Owner", text("owner", "whom it is for")),
    field("since", "Unresolved since", text("since", "e.g. 2026-12-01T14:00:00Z")),
    field("until", "Unresolved before", text("until", "e.g. 2026-12-01T15:00:00Z")),
    h("button", { type: "submit" }, "Show"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    if (query.get("order")) next.set("order", query.get("order"));
    // The chosen columns stay with a new search: they are the view, not the filter.
    if (query.get("cols") !== null) next.set("cols", query.get("cols"));
    for (const [name, value] of new FormData(form)) if (String(value).trim()) next.set(name, String(value).trim());
    location.hash = `#/review?${next}`;
  });
  return form;
}

function queuePager(query, next) {
  const links = [];
  if (query.get("after")) {
    const first = new URLSearchParams(query);
    first.delete("after");
    links.push(h("a", { href: `#/review?${first}` }, "← First page"));
  }
  if (next) {
    const following = new URLSearchParams(query);
    following.set("after", next);
    links.push(h("a", { href: `#/review?${following}`, rel: "next" }, "Next page →"));
  }
  return h("nav", { class: "pager", "aria-label": "Pages of the queue" }, links);
}

/// One decision for many: the items ticked on this page, or every item matching the page's
/// filters. A preview (the API's dry run) says what would happen first; nothing is recorded until
/// the person confirms the number shown.
function bulkPanel(query) {
  const decision = h("select", { id: "bulk-decision", name: "decision" }, h("option", { value: "abandon" }, "Give up on them — send nothing"), h("option", { value: "retry" }, "Send them again"));
  const scope = h("select", { id: "bulk-scope", name: "scope" }, h("option", { value: "matching" }, "every item matching the filters above"), h("option", { value: "ticked" }, "the items ticked below"));
  const note = h("input", { id: "bulk-note", name: "note", type: "text", maxlength: "4096", autocomplete: "off" });
  const result = h("div", { id: "bulk-result", "aria-live": "polite" });
  const body = () => {
    const request = { decision: decision.value, note: note.value.trim() };
    if (scope.value === "ticked") request.operation_ids = [...document.querySelectorAll(".queue-item input.pick:checked")].map((box) => box.value);
    else {
      request.filter = {};
      for (const name of FILTERS) if (query.get(name)) request.filter[name] = query.get(name);
    }
    return request;
  };
  const preview = h("button", { type: "button" }, "Preview");
  preview.addEventListener("click", async () => {
    const request = body();
    if (!request.note) return result.replaceChildren(errorBox(new ApiError(0, "incomplete", "Say why, in a sentence: it is recorded with every decision."), null));
    if (request.operation_ids && !request.operation_ids.length) return result.replaceChildren(errorBox(new ApiError(0, "incomplete", "Tick the items to decide, or choose every item matching the filters."), null));
    result.replaceChildren(h("p", { class: "muted" }, "Reading what would happen…"));
    try {
      const dry = await post("/v1/review/bulk", { ...request, dry_run: true });
      const verb = request.decision === "abandon" ? "Give up on" : "Send again";
      const confirm = h("button", { type: "button", class: "primary" }, `${verb} ${dry.decided.length} operation${dry.decided.length === 1 ? "" : "s"}`);
      confirm.addEventListener("click", async () => {
        confirm.disabled = true;
        result.replaceChildren(h("p", { role: "status" }, `Recording ${dry.decided.length} decisions, one by one…`));
        try {
          const done = await post("/v1/review/bulk", { ...request, operation_ids: dry.decided.map((d) => d.operation_id), filter: undefined });
          result.replaceChildren(bulkOutcome(done, false));
          announce(`${done.decided.length} decisions recorded`);
          refreshCount();
        } catch (error) {
          result.replaceChildren(errorBox(error, null));
        }
      });
      result.replaceChildren(...[bulkOutcome(dry, true), dry.decided.length ? confirm : null].filter(Boolean));
    } catch (error) {
      result.replaceChildren(errorBox(error, null));
    }
  });
  return h(
    "details",
    { class: "card bulk" },
    h("summary", {}, "Decide many at once"),
    h("div", { class: "field" }, h("label", { for: "bulk-scope" }, "Which"), scope),
    h("div", { class: "field" }, h("label", { for: "bulk-decision" }, "Decision"), decision),
    h("div", { class: "field" }, h("label", { for: "bulk-note" }, "Why (recorded with each decision)"), note),
    h("p", { class: "help" }, "Each operation gets its own decision, checked against its own state and contract; those that cannot take it are listed, not skipped. At most 1000 at a time."),
    preview,
    result,
  );
}

function bulkOutcome(answer, dry) {
  const decided = answer.decided.length;
  const refused = answer.refused;
  return h(
    "div",
    { class: dry ? "notice" : "done", role: "status" },
    h("p", {}, dry ? `${decided} would take the decision; ${refused.length} could not.` : `Decided: ${decided}. Could not take it: ${refused.length}.`),
    refused.length
      ? h("ul", { class: "refused" }, refused.map((r) => h("li", {}, link(`operation/${r.operation_id}`, shortId(r.operation_id), { title: r.operation_id }), ` — ${r.message}`)))
      : null,
  );
}

/// The queue as a table of the chosen columns: a box to tick, the state and the link to decide,
/// then each column.
function queueTable(entries, columns) {
  const cell = (key, entry) => {
    if (key.startsWith("arg:")) return argumentCell(entry.args?.[key.slice(4)]);
    switch (key) {
      case "owner":
        return entry.owner ?? "—";
      case "tenant":
        return entry.tenant;
      case "provider":
        return `${entry.provider} / ${entry.account}`;
      case "age":
        return duration(entry.age_s * 1000);
      case "attempts":
        return String(entry.attempts);
      default:
        return null;
    }
  };
  const shown = columns.filter((key) => key.startsWith("arg:") || COLUMNS[key]);
  const heading = (key) => (key.startsWith("arg:") ? key.slice(4) : COLUMNS[key]);
  return h(
    "div",
    { class: "scroll", tabindex: "0", role: "region", "aria-label": "Review queue" },
    h(
      "table",
      { class: "listing stacking queue-table" },
      h("thead", {}, h("tr", {}, ["Pick", "State", "Operation", ...shown.map(heading), "Claim"].map((x) => h("th", { scope: "col" }, x)))),
      h(
        "tbody",
        {},
        entries.map((entry) =>
          h(
            "tr",
            { class: "queue-item", "data-operation": entry.operation_id },
            h("td", { "data-label": "Pick" }, h("input", { type: "checkbox", class: "pick", value: entry.operation_id, id: `pick-${entry.operation_id}`, "aria-label": `Tick ${entry.operation_id}` })),
            h("td", { "data-label": "State" }, badge(entry.state)),
            h("td", { "data-label": "Operation" }, link(`review/${entry.operation_id}`, shortId(entry.operation_id), { title: entry.operation_id })),
            shown.map((key) => h("td", { "data-label": heading(key) }, cell(key, entry))),
            h("td", { "data-label": "Claim" }, entry.claim ? entry.claim.holder : "—"),
          ),
        ),
      ),
    ),
  );
}

function item(entry) {
  const title = entry.detail?.args?.title ?? entry.detail?.description ?? entry.operation_id;
  const owner = entry.detail?.owner;
  const pick = h("input", { type: "checkbox", class: "pick", value: entry.operation_id, id: `pick-${entry.operation_id}` });
  return h(
    "article",
    { class: "card queue-item", "data-operation": entry.operation_id },
    h("div", { class: "row" }, pick, h("label", { for: `pick-${entry.operation_id}`, class: "visually-hidden" }, `Tick “${title}”`), badge(entry.state), h("span", { class: "muted" }, `waiting ${duration(entry.age_s * 1000)}`)),
    h("h2", {}, link(`review/${entry.operation_id}`, `${entry.detail?.description ?? entry.operation_id}: “${title}”`)),
    h("p", { class: "muted" }, `tenant ${entry.tenant}${owner ? ` · for ${owner}` : ""} · ${entry.provider} / account ${entry.account} · ${entry.attempts} attempt(s), ${entry.lookups} lookup(s)`),
    h("p", {}, entry.reason ?? "The outcome of the last attempt is unknown; opledger is still checking."),
    entry.claim ? h("p", { class: "claimed" }, `Claimed by ${entry.claim.holder} until ${time(entry.claim.expires_at)}`) : null,
  );
}

async function renderItem(main, id, context) {
  const body = h("div", { "aria-busy": "true" });
  main.append(h("p", {}, link("review", "← Review queue")), pageTitle("Decide"), body);
  let item;
  let operation;
  try {
    [item, operation] = await Promise.all([reviewItem(id), get(`/v1/operations/${encodeURIComponent(id)}`)]);
  } catch (error) {
    body.replaceChildren(errorBox(error, () => location.reload()));
    return null;
  }
  body.setAttribute("aria-busy", "false");
  if (!item) {
    body.replaceChildren(
      h("div", { class: "card" }, h("p", {}, "This operation does not wait for a decision (any more): it is ", badge(operation.state), "."), h("p", {}, operation.message), h("p", {}, link(`operation/${id}`, "Open its timeline"))),
    );
    return null;
  }
  // Evidence and decision side by side on a laptop (the form stays in view while reading), one
  // after the other on a phone; the top line says where the next step is either way.
  body.className = "decide-layout";
  body.replaceChildren(
    h("p", { class: "next-step" }, "Read the evidence, check the CRM if you need to, then ", h("a", { href: "#decide-heading", onclick: jumpToForm }, "record your decision"), "."),
    h("div", { class: "evidence" }, evidence(item, operation)),
    h("aside", { class: "decide-aside", "aria-label": "Decision" }, claimBar(item, context), decisionForm(item, operation)),
  );
  return context.onEvent((event) => {
    const form = document.querySelector("form.decision");
    if (event.data.operation_id === id && form?.dataset.decided !== "true") {
      const notice = document.getElementById("moved-on");
      if (notice) notice.hidden = false;
    }
  });
}

/// Who works this case: a claim with a lease, shown to every operator, so two people do not
/// investigate and decide the same one. It ends by itself; the holder can let go.
function claimBar(item, context) {
  const me = context.name();
  const bar = h("div", { class: "card claim", id: "claim", "aria-live": "polite" });
  const show = (claim, problem) => {
    const mine = claim && claim.holder === me;
    const until = claim ? `${time(claim.expires_at)} (${relative(claim.expires_at)})` : "";
    const button = (label, path) => {
      const b = h("button", { type: "button", class: mine ? "" : "primary" }, label);
      b.addEventListener("click", async () => {
        b.disabled = true;
        try {
          const answer = await post(`/v1/review/${encodeURIComponent(item.operation_id)}/${path}`, {});
          show(answer.claim, null);
        } catch (error) {
          show(claim, error);
        }
      });
      return b;
    };
    // replaceChildren would write a null as the text "null": leave the missing ones out.
    bar.replaceChildren(
      ...[
        h("p", {}, !claim ? "Nobody is working this case." : mine ? `You hold this case until ${until}.` : `${claim.holder} is working this case until ${until}.`),
        problem ? errorBox(problem, null) : null,
        !claim || mine ? button(mine ? "Let go of it" : "Claim this case", mine ? "release" : "claim") : null,
      ].filter(Boolean),
    );
  };
  show(item.claim ?? null, null);
  return bar;
}

/// "in 14 min", "3 s ago": a time relative to now.
function relative(iso) {
  const ms = Date.parse(iso) - Date.now();
  return ms >= 0 ? `in ${duration(ms)}` : `${duration(-ms)} ago`;
}

/// The in-page link to the form: the route lives in the fragment, so move focus instead of
/// letting the link change it.
function jumpToForm(event) {
  event.preventDefault();
  const heading = document.getElementById("decide-heading");
  heading.setAttribute("tabindex", "-1");
  heading.scrollIntoView({ block: "start" });
  heading.focus();
}

/// The operation's review item with its evidence (`GET /v1/review/{id}`), or null when it does
/// not wait for review.
async function reviewItem(id) {
  try {
    return await get(`/v1/review/${encodeURIComponent(id)}`);
  } catch (error) {
    if (error instanceof ApiError && error.code === "not_found") return null;
    throw error;
  }
}

/// The evidence, in the order a person reads it: what, why, then the record.
function evidence(item, operation) {
  const detail = item.detail ?? {};
  const binding = detail.binding ?? {};
  const args = detail.args ?? {};
  return [
    h(
      "section",
      { class: "card summary", "aria-labelledby": "what-heading" },
      h("h2", { id: "what-heading" }, "What was asked"),
      h("p", { class: "big" }, `${capital(detail.description ?? binding.action ?? "an action")} in ${binding.provider ?? item.provider}, account ${binding.account ?? item.account}, for tenant ${item.tenant}.`),
      h("table", { class: "args" }, h("caption", {}, "Arguments, frozen when the request was recorded"), h("tbody", {}, Object.entries(args).map(([k, v]) => h("tr", {}, h("th", { scope: "row" }, k), h("td", {}, argumentValue(typeof v === "string" ? v : JSON.stringify(v, null, 1))))))),
      h("p", {}, badge(item.state), " ", operation.message),
    ),
    h(
      "section",
      { class: "card why", "aria-labelledby": "why-heading" },
      h("h2", { id: "why-heading" }, "Why it needs you"),
      h("p", {}, item.reason ?? "The last attempt's outcome is unknown and opledger is still looking for evidence; you may decide now or wait."),
      h("p", { class: "contract" }, h("strong", {}, "What this CRM promises about repeats: "), contractInWords(detail.contract)),
      h("p", { class: "how" }, h("strong", {}, "How to check: "), howToCheck(item, detail)),
      facts([
        ["Waiting since", `${time(item.since)} (${duration(item.age_s * 1000)})`],
        ["Last error", item.last_error],
        ["Last evidence", item.evidence],
      ]),
    ),
    h(
      "section",
      { class: "card", "aria-labelledby": "attempts-heading" },
      h("h2", { id: "attempts-heading" }, `Attempts (${(detail.attempts ?? []).length})`),
      h("p", { class: "muted" }, `Each attempt sent ${binding.action ?? "the action"} with the arguments above and idempotency key ${binding.idempotency_key ?? "—"} to account ${binding.account ?? item.account} (credentials ${binding.credential_fingerprint ?? "—"}).`),
      table(
        ["#", "Attempt", "Started", "Took", "Worker", "Outcome", "What came back"],
        (detail.attempts ?? []).map((a) => [
          a.attempt_number,
          link(`trace/${a.attempt_id}`, shortId(a.attempt_id), { title: a.attempt_id }),
          time(a.started_at),
          a.ended_at ? between(a.started_at, a.ended_at) : "still running",
          a.worker,
          a.outcome,
          a.detail ?? "—",
        ]),
      ),
    ),
    h(
      "section",
      { class: "card", "aria-labelledby": "lookups-heading" },
      h("h2", { id: "lookups-heading" }, `Lookups (${(detail.lookups ?? []).length})`),
      h("p", { class: "muted" }, "How opledger asked the CRM whether the object exists. An empty search is not proof of absence: search indexes lag."),
      table(
        ["When", "Result", "Evidence"],
        (detail.lookups ?? []).map((l) => [time(l.at), lookupResult(l.result), l.evidence]),
      ),
    ),
    h(
      "section",
      { class: "card", "aria-labelledby": "binding-heading" },
      h("h2", { id: "binding-heading" }, "Binding"),
      facts([
        ["Operation", h("span", {}, link(`operation/${item.operation_id}`, item.operation_id), " ", link(`trace/${item.operation_id}`, "(trace)"))],
        ["Tenant", binding.tenant ?? item.tenant],
        ["Provider / account", `${binding.provider ?? item.provider} / ${binding.account ?? item.account}`],
        ["Action", binding.action],
        ["Idempotency key", binding.idempotency_key],
        ["Arguments hash", detail.args_hash],
      ]),
      rawJson(item, "The review item as the API returned it"),
    ),
  ];
}

/// A concrete thing to look for at the provider, from the frozen arguments and the first send.
function howToCheck(item, detail) {
  const binding = detail.binding ?? {};
  const first = (detail.attempts ?? [])[0];
  const title = detail.args?.title ?? detail.args?.name ?? detail.args?.subject;
  const what = title ? `“${title}”` : "an object with the arguments above";
  const when = first ? ` created around ${time(first.started_at)}` : "";
  // The label opledger sends with every create (`opl-` and the operation id) is what its own
  // lookups search for; a person searching the CRM by hand can use either.
  const label = (detail.lookups ?? []).length ? ` (opledger's own searches looked for the label opl-${item.operation_id})` : "";
  return `in ${binding.provider ?? item.provider}, account ${binding.account ?? item.account}, look for ${what}${when}${label}. If it is there, choose “It exists” and give its id; if you are sure it is not, send it again. If you cannot check, giving up is the safe choice: nothing more is sent and the agent is told it was not done.`;
}

function capital(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

function lookupResult(result) {
  if (!result) return "—";
  if (typeof result === "string") return result;
  const kind = (result.kind ?? "").replaceAll("_", " ");
  return result.authoritative === false ? `${kind} (not proof)` : kind;
}

/// Longer argument values than this (in characters) are collapsed to their first line, so a
/// pasted document does not push the evidence off the screen.
const ARGUMENT_SHOWN_CHARS = 240;

/// An argument's value, collapsed behind its beginning when it is long.
function argumentValue(text) {
  if (text.length <= ARGUMENT_SHOWN_CHARS) return text;
  return h("details", { class: "long-argument" }, h("summary", {}, `${text.slice(0, ARGUMENT_SHOWN_CHARS / 2)}… (${text.length.toLocaleString("en")} characters; show all)`), h("pre", {}, text));
}

/// The action's deduplication contract in plain words, from the contract the API reports (the
/// one every retry is checked against), not from the wording of a reason.
function contractInWords(contract) {
  switch (contract?.deduplication) {
    case "none":
      return "nothing. It cannot tell a repeated request from a new one, so if the first request did arrive, a retry creates a second object.";
    case "idempotency_key":
      return contract.key_expired
        ? `it recognises a repeat by its idempotency key only for a limited time, and that time ended ${time(contract.key_usable_until)}: a retry now may create a second object.`
        : `it recognises a repeat by its idempotency key until ${time(contract.key_usable_until)}, so a retry with the same key before then does not create a second object.`;
    case "unique_label":
      return "it refuses a second object with the same label, so a retry cannot create a duplicate.";
    case "naturally_idempotent":
      return "repeating this request has no further effect, so a retry is safe.";
    default:
      return "unknown: the action is no longer configured, so nothing can be said about repeats. Check the CRM before retrying.";
  }
}

function table(headings, rows) {
  if (!rows.length) return h("p", { class: "muted" }, "None.");
  return h(
    "div",
    { class: "scroll", tabindex: "0", role: "region", "aria-label": headings.join(", ") },
    h("table", { class: "stacking" }, h("thead", {}, h("tr", {}, headings.map((x) => h("th", { scope: "col" }, x)))), h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c, i) => h("td", { "data-label": headings[i] }, c)))))),
  );
}

const CHOICES = [
  ["confirm", "It exists — I found it in the CRM", "Record the operation as done with the object's id. Nothing is sent."],
  ["retry", "It does not exist — send it again", "The same request is sent once more, with the same key and label."],
  ["abandon", "Give up — do not send it", "The operation ends without an object and the agent is told it was not done. Choose this when it should not happen, or when you cannot check and would rather have it asked for again than risk a duplicate."],
];

function decisionForm(item, operation) {
  const id = item.operation_id;
  const version = operation.version;
  const externalId = h("input", { id: "external-id", name: "external_id", type: "text", autocomplete: "off", maxlength: "256", "aria-describedby": "external-id-help" });
  const externalRow = h("div", { class: "field", id: "external-id-row", hidden: true }, h("label", { for: "external-id" }, "The object's id in the CRM"), externalId, h("p", { id: "external-id-help", class: "help" }, "As the CRM shows it, e.g. a task number."));
  const noteField = h("textarea", { id: "note", name: "note", rows: "3", maxlength: "4096", required: true, "aria-describedby": "note-help" });
  const result = h("div", { id: "decision-result", "aria-live": "polite" });
  const risk = h("div", { id: "risk", hidden: true });
  const radios = CHOICES.map(([value, label, help]) =>
    h("div", { class: "choice" }, h("input", { type: "radio", name: "decision", id: `decision-${value}`, value, "aria-describedby": `decision-${value}-help` }), h("label", { for: `decision-${value}` }, label), h("p", { class: "help", id: `decision-${value}-help` }, help)),
  );
  const submit = h("button", { type: "submit", class: "primary" }, "Record decision");
  const form = h(
    "form",
    { class: "card decision", novalidate: true, "aria-labelledby": "decide-heading" },
    h("h2", { id: "decide-heading" }, "Your decision"),
    h("p", { class: "help", id: "moved-on", hidden: true, role: "status" }, "New events arrived for this operation since you opened it. Reload to see them before you decide."),
    h("fieldset", {}, h("legend", {}, "What should happen to this request?"), radios),
    externalRow,
    h("div", { class: "field" }, h("label", { for: "note" }, "Why (recorded with your decision)"), noteField, h("p", { id: "note-help", class: "help" }, "What you checked and what you found, for whoever reads this operation's history later.")),
    h("p", { class: "help", id: "version-help" }, `You are deciding on version ${version} of this operation, as loaded at ${time(new Date().toISOString())}. If anything changes before you submit, the decision is refused instead of applied to something you have not seen.`),
    risk,
    submit,
    result,
  );
  form.addEventListener("change", (event) => {
    if (event.target.name === "decision") {
      externalRow.hidden = event.target.value !== "confirm";
      // Where the contract cannot make a retry safe, the acknowledgement is asked for when the
      // retry is chosen, not only after the server refused it.
      const ask = event.target.value === "retry" && retryMayDuplicate(item.detail?.contract);
      risk.replaceChildren(...(ask ? riskNotice(null, item) : []));
      risk.hidden = !ask;
    }
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const decision = form.querySelector("input[name=decision]:checked")?.value;
    const problems = [];
    if (!decision) problems.push("Choose what should happen.");
    if (decision === "confirm" && !externalId.value.trim()) problems.push("Give the object's id in the CRM, or choose another decision.");
    if (!noteField.value.trim()) problems.push("Say why, in a sentence.");
    if (problems.length) {
      result.replaceChildren(errorBox(new ApiError(0, "incomplete", problems.join(" ")), null));
      return;
    }
    const body = { decision, note: noteField.value.trim(), expected_version: version };
    if (decision === "confirm") body.external_id = externalId.value.trim();
    const accepted = form.querySelector("#accept-risk");
    if (decision === "retry" && accepted?.checked) body.accept_duplicate_risk = true;
    submit.disabled = true;
    result.replaceChildren(h("p", { class: "muted" }, "Recording…"));
    try {
      const decided = await post(`/v1/operations/${encodeURIComponent(id)}/review`, body);
      // The events that follow are this decision's own, not news to reload for.
      form.dataset.decided = "true";
      form.querySelector("#moved-on").hidden = true;
      refreshCount();
      form.querySelector("fieldset").disabled = true;
      submit.hidden = true;
      risk.hidden = true;
      result.replaceChildren(
        h("div", { class: "done", role: "status" }, h("p", { class: "big" }, "Decision recorded. The operation is now ", badge(decided.state), "."), h("p", {}, decided.message), h("p", {}, link(`operation/${id}`, "See it in the timeline"), " · ", link("review", "Back to the queue"))),
      );
      announce("Decision recorded");
    } catch (error) {
      submit.disabled = false;
      if (error.code === "stale") result.replaceChildren(staleNotice(error, version));
      else if (error.code === "claimed") result.replaceChildren(errorBox(error, null));
      else if (error.code === "duplicate_risk_not_accepted") {
        result.replaceChildren();
        risk.replaceChildren(...riskNotice(error, item));
        risk.hidden = false;
        form.querySelector("#accept-risk").focus();
      } else result.replaceChildren(errorBox(error, null));
    }
  });
  return form;
}

function staleNotice(error, version) {
  return h(
    "div",
    { class: "error stale", role: "alert" },
    h("p", { class: "error-title" }, "Not recorded: this operation changed after you opened it"),
    h("p", {}, `You looked at version ${version}. The server says: “${error.message}”.`),
    h("p", { class: "advice" }, "Your decision was not applied, so nothing was sent. Reload the evidence, read what is new, and decide again."),
    h("button", { type: "button", onclick: () => location.reload() }, "Reload the evidence"),
  );
}

/// Whether the action's contract cannot make a retry safe (the API then refuses a retry without
/// `accept_duplicate_risk`): no deduplication, or an idempotency key the provider has forgotten.
function retryMayDuplicate(contract) {
  return contract?.deduplication === "none" || (contract?.deduplication === "idempotency_key" && contract.key_expired === true);
}

/// The duplicate-risk explanation and its acknowledgement: asked for when a risky retry is
/// chosen (`error` null), and as an alert when the server refused one without it.
function riskNotice(error, item) {
  return [
    h(
      "div",
      { class: "warning", role: error ? "alert" : "note" },
      h("p", { class: "error-title" }, error ? "Nothing was sent: a retry here may create a duplicate" : "A retry here may create a duplicate"),
      h("p", {}, `${item.provider} does not recognise a repeated request for this action. If the first attempt did reach it — the answer was lost, not necessarily the request — a retry creates a second object, exactly the duplicate opledger exists to prevent.`),
      h("p", {}, "Before retrying, look in the CRM for the object (the attempts' times and the arguments above help). If you find it, choose “It exists” and give its id instead. Retry only if you are sure it is not there."),
      error ? h("details", {}, h("summary", {}, "The API's words (duplicate_risk_not_accepted)"), h("p", {}, error.message)) : null,
    ),
    h("div", { class: "choice" }, h("input", { type: "checkbox", id: "accept-risk", name: "accept_duplicate_risk" }), h("label", { for: "accept-risk" }, "I checked the CRM: the object is not there, and I accept that a retry may create a duplicate. (This is recorded with my decision.)")),
  ];
}

/// The queue's size in the navigation (the server's count of this token's unresolved
/// operations), asked again after a decision.
export async function refreshCount() {
  const counts = await get("/v1/counts").catch(() => null);
  if (!counts) return;
  const n = (counts.by_state.unknown ?? 0) + (counts.by_state.needs_review ?? 0);
  const count = document.getElementById("review-count");
  if (count) count.textContent = n ? String(n) : "";
}

/// `action` at most once per REFRESH_EVERY_MS however many calls arrive: the first call starts
/// the wait and those during it ride along.
function throttled(action) {
  let timer = null;
  return () => {
    timer ??= setTimeout(() => {
      timer = null;
      action();
    }, REFRESH_EVERY_MS);
  };
}
