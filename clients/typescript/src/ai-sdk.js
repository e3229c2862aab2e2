// The Vercel AI SDK (`ai`, v5 and v6): a tool's `execute` guarded by the ledger, with the SDK's own
// `toolCallId` as the request id, so the SDK's (or the model's) repeat of one tool call finds the
// operation the first one recorded. `ai` is a peer dependency: the user's own copy is used.
//
// A refusal (409 `idempotency_key_reused`, 422 `invalid_input`, …) throws the LedgerError, whose
// message carries the API's: the SDK makes it the tool call's `tool-error` and hands it to the
// model. A ledger that never answered is an answer ("not confirmed: do not repeat it").

import { jsonSchema, tool } from "ai";

import { Unavailable } from "./index.js";

// The client too, so a user imports one module: the adapter and the Ledger it takes.
export { Ledger } from "./index.js";

/** @import { Ledger, Action } from "./index.js" */

/**
 * An `execute` for the SDK's `tool()`: records and executes `action` once per tool call and
 * answers the ledger's sentence (a not-confirmed outcome is an answer, not an error).
 * @param {Ledger} ledger
 * @param {Action | { provider: string, account: string, action: string }} action
 * @param {{ waitMs?: number }} [options]
 * @returns {(input: any, call: { toolCallId: string }) => Promise<string>}
 */
export function guardedExecute(ledger, action, options) {
  const guarded = ledger.guardedTool(action, options);
  return async (input, { toolCallId }) => {
    const { text, error } = await guarded.answer(input, { requestId: toolCallId });
    if (error !== undefined && !(error instanceof Unavailable)) throw error;
    return text;
  };
}

/**
 * Every action this tenant may use, as the SDK's tools (keyed by name), built from
 * `GET /v1/actions`: a new action on the server needs no code here.
 * @param {Ledger} ledger
 * @param {{ waitMs?: number }} [options]
 */
export async function ledgerTools(ledger, options) {
  /** @type {Record<string, import("ai").Tool<any, string>>} */
  const tools = {};
  for (const action of await ledger.actions()) {
    tools[action.name] = tool({
      description: action.description,
      inputSchema: jsonSchema(/** @type {any} */ (action.input_schema)),
      execute: guardedExecute(ledger, action, options),
    });
  }
  return tools;
}
