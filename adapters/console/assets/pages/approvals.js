// Approvals: operations waiting for a person's approval before anything is sent, each with the
// argument snapshot and its hash. Approving names the hash, so an approval covers exactly the
// snapshot shown here; the API refuses it if the arguments are not that snapshot.

import { ApiError, get, needsTenant, post } from "../api.js";
import { announce, badge, errorBox, facts, h, link, pageTitle, tenantPicker, time } from "../ui.js";

/// The most waiting operations one page shows.
const ROWS = 100;

export async function render(main, { query }, context) {
  const list = h("div", { "aria-busy": "true" });
  main.append(pageTitle("Approvals"), h("p", { class: "lead" }, "Requests that wait for a person before anything is sent. Approve exactly what is shown, or deny it with a reason."), list);
  if (context.role() === "operator") {
    // The API answers an operator's approval with 403: offering buttons that always fail is worse
    // than saying who can approve.
    list.setAttribute("aria-busy", "false");
    list.replaceChildren(h("p", { class: "card notice" }, "Approvals are given by the tenant or by an approver configured for it (under [[approvers]]); an operator token cannot approve or deny. Sign in with one of those tokens to approve."));
    return null;
  }
  const tenant = query.get("tenant");
  try {
    const page = await get(`/v1/operations?state=awaiting_approval&limit=${ROWS}${tenant ? `&tenant=${encodeURIComponent(tenant)}` : ""}`);
    const operations = await Promise.all(page.operations.map((op) => get(`/v1/operations/${op.operation_id}`)));
    list.replaceChildren(...(operations.length ? operations.map(card) : [h("p", { class: "empty card" }, "Nothing waits for approval.")]));
  } catch (error) {
    list.replaceChildren(
      needsTenant(error)
        ? tenantPicker("This token sees several tenants. Whose approvals should be shown?", (chosen) => {
            location.hash = `#/approvals?tenant=${encodeURIComponent(chosen)}`;
          })
        : errorBox(error, null),
    );
  }
  list.setAttribute("aria-busy", "false");
  return null;
}

function card(operation) {
  const id = operation.operation_id;
  const key = id.slice(0, 8);
  const approver = h("input", { id: `approver-${key}`, type: "text", autocomplete: "name", maxlength: "256" });
  const reason = h("input", { id: `reason-${key}`, type: "text", maxlength: "4096" });
  const result = h("div", { "aria-live": "polite" });
  const act = async (verb) => {
    const body = { args_hash: operation.args_hash };
    if (approver.value.trim()) body.approver = approver.value.trim();
    if (verb === "deny") {
      if (!reason.value.trim()) {
        result.replaceChildren(errorBox(new ApiError(0, "incomplete", "Say why you deny it: the reason is recorded and shown to whoever asked."), null));
        reason.focus();
        return;
      }
      body.reason = reason.value.trim();
    }
    try {
      const decided = await post(`/v1/operations/${encodeURIComponent(id)}/${verb}`, body);
      result.replaceChildren(h("p", { class: "done", role: "status" }, `${verb === "approve" ? "Approved" : "Denied"}: now `, badge(decided.state), " ", link(`operation/${id}`, "timeline")));
      announce(verb === "approve" ? "Approved" : "Denied");
    } catch (error) {
      result.replaceChildren(errorBox(error, null));
    }
  };
  return h(
    "article",
    { class: "card" },
    h("h2", {}, `${operation.action} at ${operation.provider} / ${operation.account}`),
    facts([
      ["Tenant", operation.tenant],
      ["Recorded", time(operation.updated_at)],
      ["Arguments hash", h("code", {}, operation.args_hash)],
    ]),
    h("pre", { class: "snapshot", "aria-label": "Argument snapshot" }, JSON.stringify(operation.args, null, 2)),
    h("div", { class: "field" }, h("label", { for: `approver-${key}` }, "Your name (needed with a tenant token; an approver token records its own)"), approver),
    h("div", { class: "field" }, h("label", { for: `reason-${key}` }, "Reason (needed to deny)"), reason),
    h("div", { class: "row" }, h("button", { type: "button", class: "primary", onclick: () => act("approve") }, "Approve this snapshot"), h("button", { type: "button", onclick: () => act("deny") }, "Deny")),
    result,
  );
}
