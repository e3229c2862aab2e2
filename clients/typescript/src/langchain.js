// LangChain.js (`@langchain/core`): a tool function guarded by the ledger, with the id of the
// ToolCall the tool is invoked with (`config.toolCall.id`) as the request id, so a repeated
// invocation of one tool call finds the operation the first one recorded. A peer dependency.
//
// A refusal (409 `idempotency_key_reused`, 422 `invalid_input`, …) of a ToolCall answers a
// ToolMessage with `status: "error"` and the API's message as its content, as LangGraph's ToolNode
// makes of a failed tool: the agent's loop goes on and the model reads why. Called without a
// ToolCall (by hand), a refusal throws the LedgerError.

import { ToolMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";

// The client too, so a user imports one module: the adapter and the Ledger it takes.
export { Ledger } from "./index.js";

/** @import { Ledger, Action } from "./index.js" */

/**
 * A function for LangChain's `tool(func, fields)`.
 * @param {Ledger} ledger
 * @param {Action | { provider: string, account: string, action: string }} action
 * @param {{ waitMs?: number }} [options]
 * @returns {(input: any, config?: { toolCall?: { id?: string, name?: string } }) => Promise<string | ToolMessage>}
 */
export function guardedFunc(ledger, action, options) {
  const guarded = ledger.guardedTool(action, options);
  return async (input, config) => {
    const id = config?.toolCall?.id;
    if (id === undefined) return (await guarded.run(input, {})).text;
    const { text, refused } = await guarded.answer(input, { requestId: id });
    if (!refused) return text;
    return new ToolMessage({ content: text, tool_call_id: id, name: config?.toolCall?.name ?? guarded.name, status: "error" });
  };
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
