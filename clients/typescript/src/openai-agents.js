// The OpenAI Agents SDK for TypeScript (`@openai/agents`): a function tool's `execute` guarded by
// the ledger, with the model's function-call id (`details.toolCall.callId`) as the request id,
// so a repeated call finds the operation the first one recorded. A peer dependency.
//
// A refusal (409 `idempotency_key_reused`, 422 `invalid_input`, …) is the tool's output with the
// API's message in it: thrown, the SDK would hand the model only "An error occurred while running
// the tool. Please try again.", which loses the reason and invites a repeat.

import { tool } from "@openai/agents";

// The client too, so a user imports one module: the adapter and the Ledger it takes.
export { Ledger } from "./index.js";

/** @import { Ledger, Action } from "./index.js" */

/**
 * An `execute` for the SDK's `tool()`. Without a function-call id (a tool called by hand) the
 * call is a new request, as it would be without the ledger.
 * @param {Ledger} ledger
 * @param {Action | { provider: string, account: string, action: string }} action
 * @param {{ waitMs?: number }} [options]
 * @returns {(input: any, context?: unknown, details?: { toolCall?: { callId?: string } }) => Promise<string>}
 */
export function guardedExecute(ledger, action, options) {
  const guarded = ledger.guardedTool(action, options);
  return async (input, _context, details) =>
    (await guarded.answer(input, { requestId: details?.toolCall?.callId })).text;
}

/**
 * Every action this tenant may use, as the SDK's function tools, from `GET /v1/actions`. Not
 * strict: an action's schema need not meet the strict mode's rules (every property required).
 * @param {Ledger} ledger
 * @param {{ waitMs?: number }} [options]
 */
export async function ledgerTools(ledger, options) {
  return (await ledger.actions()).map((action) =>
    tool({
      name: action.name,
      description: action.description,
      parameters: /** @type {any} */ (action.input_schema),
      strict: false,
      execute: guardedExecute(ledger, action, options),
    }),
  );
}
