/** @import { Ledger, Action } from "./index.js" */
/**
 * An `execute` for the SDK's `tool()`. Without a function-call id (a tool called by hand) the
 * call is a new request, as it would be without the ledger.
 * @param {Ledger} ledger
 * @param {Action | { provider: string, account: string, action: string }} action
 * @param {{ waitMs?: number }} [options]
 * @returns {(input: any, context?: unknown, details?: { toolCall?: { callId?: string } }) => Promise<string>}
 */
export function guardedExecute(ledger: Ledger, action: Action | {
    provider: string;
    account: string;
    action: string;
}, options?: {
    waitMs?: number;
}): (input: any, context?: unknown, details?: {
    toolCall?: {
        callId?: string;
    };
}) => Promise<string>;
/**
 * Every action this tenant may use, as the SDK's function tools, from `GET /v1/actions`. Not
 * strict: an action's schema need not meet the strict mode's rules (every property required).
 * @param {Ledger} ledger
 * @param {{ waitMs?: number }} [options]
 */
export function ledgerTools(ledger: Ledger, options?: {
    waitMs?: number;
}): Promise<import("@openai/agents").FunctionTool<unknown, any, string>[]>;
export { Ledger } from "./index.js";
import type { Ledger } from "./index.js";
import type { Action } from "./index.js";
