// LangChain.js (`@langchain/core`): a tool function guarded by the ledger, with the id of the
// ToolCall the tool is invoked with (`config.toolCall.id`) as the request id, so a repeated
// invocation of one tool call finds the operation the first one recorded. A peer dependency.

import { tool } from "@langchain/core/tools";

// The client too, so a user imports one module: the adapter and the Ledger it takes.
export { Ledger } from "./index.js";

/** @import { Ledger, Action } from "./index.js" */

/**
 * A function for LangChain's `tool(func, fields)`.
 * @param {Ledger} ledger
 * @param {Action | { provider: string, account: string, action: string }} action
 * @param {{ waitMs?: number }} [options]
 * @returns {(input: any, config?: { toolCall?: { id?: string } }) => Promise<string>}
 */
export function guardedFunc(ledger, action, options) {
  const guarded = ledger.guardedTool(action, options);
  return async (input, config) => (await guarded.run(input, { requestId: config?.toolCall?.id })).text;
}

/**
 * Every action this tenant may use, as LangChain tools, from `GET /v1/actions`.
 * @param {Ledger} ledger
 * @param {{ waitMs?: number }} [options]
 */
export async function ledgerTools(ledger, options) {
  return (await ledger.actions()).map((action) =>
    tool(guardedFunc(ledger, action, options), {
      name: action.name,
      description: action.description,
      schema: /** @type {any} */ (action.input_schema),
    }),
  );
}
