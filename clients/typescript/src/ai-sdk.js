// The Vercel AI SDK (`ai`, v5): a tool's `execute` guarded by the ledger, with the SDK's own
// `toolCallId` as the request id, so the SDK's (or the model's) repeat of one tool call finds the
// operation the first one recorded. `ai` is a peer dependency: the user's own copy is used.

import { jsonSchema, tool } from "ai";

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
  return async (input, { toolCallId }) => (await guarded.run(input, { requestId: toolCallId })).text;
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
