/** @import { Ledger, Action } from "./index.js" */
/**
 * An `execute` for the SDK's `tool()`: records and executes `action` once per tool call and
 * answers the ledger's sentence (a not-confirmed outcome is an answer, not an error).
 * @param {Ledger} ledger
 * @param {Action | { provider: string, account: string, action: string }} action
 * @param {{ waitMs?: number }} [options]
 * @returns {(input: any, call: { toolCallId: string }) => Promise<string>}
 */
export function guardedExecute(ledger: Ledger, action: Action | {
    provider: string;
    account: string;
    action: string;
}, options?: {
    waitMs?: number;
}): (input: any, call: {
    toolCallId: string;
}) => Promise<string>;
/**
 * Every action this tenant may use, as the SDK's tools (keyed by name), built from
 * `GET /v1/actions`: a new action on the server needs no code here.
 * @param {Ledger} ledger
 * @param {{ waitMs?: number }} [options]
 */
export function ledgerTools(ledger: Ledger, options?: {
    waitMs?: number;
}): Promise<Record<string, import("ai").Tool<any, string>>>;
export { Ledger } from "./index.js";
import type { Ledger } from "./index.js";
import type { Action } from "./index.js";
