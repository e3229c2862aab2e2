/** @import { Ledger, Action } from "./index.js" */
/**
 * A function for LangChain's `tool(func, fields)`.
 * @param {Ledger} ledger
 * @param {Action | { provider: string, account: string, action: string }} action
 * @param {{ waitMs?: number }} [options]
 * @returns {(input: any, config?: { toolCall?: { id?: string, name?: string } }) => Promise<string | ToolMessage>}
 */
export function guardedFunc(ledger: Ledger, action: Action | {
    provider: string;
    account: string;
    action: string;
}, options?: {
    waitMs?: number;
}): (input: any, config?: {
    toolCall?: {
        id?: string;
        name?: string;
    };
}) => Promise<string | ToolMessage>;
/**
 * Every action this tenant may use, as LangChain tools, from `GET /v1/actions`.
 * @param {Ledger} ledger
 * @param {{ waitMs?: number }} [options]
 */
export function ledgerTools(ledger: Ledger, options?: {
    waitMs?: number;
}): Promise<import("@langchain/core/tools").DynamicTool<string | ToolMessage<import("@langchain/core/messages").MessageStructure<import("@langchain/core/messages").MessageToolSet>>, unknown>[]>;
export { Ledger } from "./index.js";
import type { Ledger } from "./index.js";
import type { Action } from "./index.js";
import { ToolMessage } from "@langchain/core/messages";
