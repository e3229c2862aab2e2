/**
 * The typed error for an answer: by the API's code, else by the HTTP status.
 * @param {number} status
 * @param {ConstructorParameters<typeof LedgerError>[1]} code
 * @param {string} message
 * @param {{ pointer: string, message: string }[]} [fields]
 * @param {string} [requestId]
 * @returns {LedgerError}
 */
export function errorOf(status: number, code: ConstructorParameters<typeof LedgerError>[1], message: string, fields?: {
    pointer: string;
    message: string;
}[], requestId?: string): LedgerError;
/**
 * What a guarded tool hands the model when the ledger refuses a call or never answers: the API's
 * own message, and what to do. Never "done".
 * @param {LedgerError} error
 */
export function refusalText(error: LedgerError): string;
/** Whether `operation` is settled as confirmed: it succeeded and names the object. */
export function confirmed(operation: Operation): boolean;
/** Whether `operation`'s outcome is not known yet: do not repeat it; ask `status` later. */
export function notConfirmed(operation: Operation): boolean;
/**
 * What a guarded tool answers: the ledger's sentence, and for a send not confirmed yet (its
 * sentence says so but gives no advice) that it must not be repeated, as the MCP tools say.
 * @param {Operation} operation
 */
export function sentenceOf(operation: Operation): string;
/**
 * Server-Sent Events from a byte stream, as the WHATWG parsing rules read them.
 * @param {ReadableStream<Uint8Array>} body
 * @returns {AsyncGenerator<{ id?: string, event?: string, data: string }>}
 */
export function serverSentEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<{
    id?: string;
    event?: string;
    data: string;
}>;
/** @import { components } from "../types/openapi.js" */
/** @typedef {components["schemas"]["Operation"]} Operation */
/** @typedef {components["schemas"]["State"]} State */
/** @typedef {components["schemas"]["OperationPage"]} OperationPage */
/** @typedef {components["schemas"]["History"]} History */
/** @typedef {components["schemas"]["Trace"]} Trace */
/** @typedef {components["schemas"]["ReviewQueue"]} ReviewQueue */
/** @typedef {components["schemas"]["ReviewRequest"]} ReviewRequest */
/** @typedef {components["schemas"]["OutcomeEvent"]} OutcomeEvent */
/** @typedef {components["schemas"]["Action"]} Action */
/** @typedef {components["schemas"]["Counts"]} Counts */
/** @typedef {components["schemas"]["Principal"]} Principal */
/** @typedef {components["schemas"]["ErrorCode"]} ErrorCode */
/**
 * What to record: the provider, the account, the action and its arguments.
 * @typedef {object} Intent
 * @property {string} provider
 * @property {string} account
 * @property {string} action
 * @property {Record<string, unknown>} args
 * @property {string} [owner]
 * @property {boolean} [requires_approval]
 */
/**
 * An answer about one operation, with what the HTTP exchange said beside it.
 * @typedef {Operation & { replayed: boolean }} Answer
 */
/** States that will not change without a person (or never). */
export const SETTLED_STATES: readonly ["succeeded", "rejected", "denied", "abandoned"];
/** States whose outcome is not known yet: never repeat the call; ask `status` later. */
export const NOT_CONFIRMED_STATES: readonly ["pending", "in_flight", "unknown", "needs_review"];
/**
 * How long one HTTP request may take, in milliseconds, unless the client is told otherwise:
 * longer than the server's largest `wait_ms` (30 s by default), so an execute answers first.
 */
export const DEFAULT_TIMEOUT_MS: 40000;
/**
 * How many times in a row the outcome feed reconnects without receiving an event before it gives
 * up and throws (with the position to resume from): a server that is gone for good is reported,
 * not retried for ever.
 */
export const MAX_CONSECUTIVE_RECONNECTS: 20;
/** The pause before the outcome feed reconnects, in milliseconds. */
export const RECONNECT_PAUSE_MS: 500;
/** The longest request id a guarded tool sends as an `Idempotency-Key`, in bytes (TextId). */
export const MAX_REQUEST_ID_BYTES: 256;
/**
 * How many times a request that is safe to repeat is repeated after no answer, a timeout, a 503
 * or a 429 (Stripe's SDKs repeat twice by default). A record is repeated with the same
 * Idempotency-Key, so a repeat finds the operation the lost attempt recorded.
 */
export const DEFAULT_MAX_RETRIES: 2;
/** The first pause before a repeat, in milliseconds; each further one doubles, with full jitter. */
export const RETRY_BASE_MS: 500;
/** The longest pause before one repeat, in milliseconds. */
export const RETRY_CAP_MS: 8000;
/** The first pause between two reads of `waitFor`, in milliseconds; it grows to one second. */
export const WAIT_POLL_MS: 50;
/**
 * The API refused a request (`{"error": {"code", "message"}}`, `status` the HTTP status), or
 * could not be reached (`status` 0, `code` "unreachable" or "timeout": whether a record arrived
 * is unknown, so repeat it with the same idempotency key). `detail` is the API's message,
 * `requestId` the idempotency key the request was sent under (the same on every repeat). Catch a
 * subclass to act on one family.
 */
export class LedgerError extends Error {
    /**
     * @param {number} status
     * @param {ErrorCode | "unreachable" | "timeout" | "http_error" | "wait_timed_out" | `step_${string}`} code
     * @param {string} message
     * @param {{ pointer: string, message: string }[]} [fields]
     * @param {string} [requestId]
     */
    constructor(status: number, code: ErrorCode | "unreachable" | "timeout" | "http_error" | "wait_timed_out" | `step_${string}`, message: string, fields?: {
        pointer: string;
        message: string;
    }[], requestId?: string);
    status: number;
    code: "malformed_json" | "body_unreadable" | "invalid_path" | "invalid_input" | "unauthorized" | "duplicate_authorization" | "forbidden" | "not_found" | "no_such_route" | "method_not_allowed" | "body_timeout" | "refused" | "source_id_reused" | "idempotency_key_reused" | "duplicate_risk_not_accepted" | "stale" | "too_large" | "too_many_streams" | "too_many_executes" | "contended" | "outcome_unknown" | "store_unavailable" | "read_models_behind" | "claimed" | "not_waiting" | "too_many_claims" | "no_checkpoint" | "not_in_tree" | "no_such_tile" | "exists" | "configured_in_file" | "too_many_secrets" | "no_webhooks_here" | "personal_data_off" | "subject_erased" | "internal" | `step_${string}` | "unreachable" | "timeout" | "http_error" | "wait_timed_out";
    detail: string;
    fields: {
        pointer: string;
        message: string;
    }[];
    requestId: string | undefined;
    /** Whether the same request may be repeated as it is (the server said so, or never answered). */
    get retryable(): boolean;
}
/** 422 `invalid_input` (and the other malformed-request codes): fix the request. */
export class InvalidInput extends LedgerError {
}
/** 409 `idempotency_key_reused` / `source_id_reused`: the key named another request. */
export class IdempotencyKeyReused extends LedgerError {
}
/** 409: refused by the ledger's rules (`refused`, `stale`, `duplicate_risk_not_accepted`). */
export class Conflict extends LedgerError {
}
/** 404: no such operation (or not this tenant's). */
export class NotFound extends LedgerError {
}
/** 401 / 403: the token is unknown or may not do this. */
export class Unauthorized extends LedgerError {
}
/** 429: too many requests at once; repeated by the client up to `maxRetries`. */
export class RateLimited extends LedgerError {
}
/** 503, a timeout or no answer: repeated with the same key by the client up to `maxRetries`. */
export class Unavailable extends LedgerError {
}
/**
 * A guarded step gave no result: `operation` is where the ledger says it stands, and
 * `operation.message` is what to tell the user.
 */
export class StepError extends LedgerError {
    /** @param {Operation} operation @param {`step_${string}`} code */
    constructor(operation: Operation, code: `step_${string}`);
    operation: {
        account: components["schemas"]["TextId"];
        action: components["schemas"]["TextId"];
        args: Record<string, never>;
        args_hash: components["schemas"]["ArgsHash"];
        as_of_position?: number;
        attempt_ids: string[];
        attempts: number;
        created?: boolean;
        duplicates: components["schemas"]["TextId"][];
        execute_error?: components["schemas"]["ExecuteError"];
        external_id: string | null;
        idempotency_key: string;
        last_error: string | null;
        message: string;
        operation_id: string;
        owner: string | null;
        proof?: 
        /**
         * @param {number} ms
         * @param {AbortSignal | undefined} signal
         */
        components["schemas"]["OperationProof"];
        provider: components["schemas"]["TextId"];
        requires_approval: boolean;
        review_reason: string | null;
        source_id: string | null;
        state: components["schemas"]["State"];
        tenant: components["schemas"]["TextId"];
        unknown_since: string | null;
        updated_at: string;
        version: number;
    };
}
/** The step's function failed without taking effect (`rejected`); a repeat answers it again. */
export class StepFailed extends StepError {
}
/**
 * Whether the step took effect is unknown (`unknown`, `needs_review`): its function is never run
 * again for this key; a person checks and decides.
 */
export class StepNotConfirmed extends StepError {
}
/** Another process holds the step's claim now (`in_flight`): do not run it here. */
export class StepInProgress extends StepNotConfirmed {
}
/**
 * Throw it from a guarded function when nothing took effect: the step is recorded as failed
 * (`rejected`), not as unknown. Any other error is recorded as "may have taken effect".
 */
export class StepDidNotApply extends Error {
}
/** How long a step's claim holds without an outcome unless the step says otherwise, in ms. */
export const DEFAULT_STEP_LEASE_MS: 30000;
/**
 * How a step is guarded.
 * @typedef {object} StepOptions
 * @property {string} provider your code's system, e.g. `billing` (not a configured connector)
 * @property {string} action what the function does there, e.g. `charge`
 * @property {(...args: any[]) => string} [key] names a call from its arguments (default: the
 *   arguments themselves)
 * @property {(result: any) => string | number} [resultId] what the result is recorded as
 * @property {number} [leaseMs] how long the claim holds without an outcome
 * @property {string} [caller] your name for this process, recorded with the attempt
 */
/**
 * What a guarded function is given besides its arguments: the step's key, the same on every
 * attempt, to pass on to its own system.
 * @typedef {{ idempotencyKey: string, operationId: string, attemptId: string }} StepContext
 */
/** `waitFor` reached its timeout first; `operation` is where it stood last. */
export class WaitTimedOut extends LedgerError {
    /** @param {Operation} operation @param {number} timeoutMs */
    constructor(operation: Operation, timeoutMs: number);
    operation: {
        account: components["schemas"]["TextId"];
        action: components["schemas"]["TextId"];
        args: Record<string, never>;
        args_hash: components["schemas"]["ArgsHash"];
        as_of_position?: number;
        attempt_ids: string[];
        attempts: number;
        created?: boolean;
        duplicates: components["schemas"]["TextId"][];
        execute_error?: components["schemas"]["ExecuteError"];
        external_id: string | null;
        idempotency_key: string;
        last_error: string | null;
        message: string;
        operation_id: string;
        owner: string | null;
        proof?: 
        /**
         * @param {number} ms
         * @param {AbortSignal | undefined} signal
         */
        components["schemas"]["OperationProof"];
        provider: components["schemas"]["TextId"];
        requires_approval: boolean;
        review_reason: string | null;
        source_id: string | null;
        state: components["schemas"]["State"];
        tenant: components["schemas"]["TextId"];
        unknown_since: string | null;
        updated_at: string;
        version: number;
    };
}
/**
 * @typedef {object} LedgerOptions
 * @property {string} token A tenant's (or an operator's, an approver's) bearer token.
 * @property {typeof fetch} [fetch] The fetch to use (default: the global one).
 * @property {number} [timeoutMs] One request's limit, in milliseconds.
 * @property {number} [maxRetries] How often a request safe to repeat is repeated (default 2).
 * @property {(ms: number) => Promise<void>} [sleep] How the client pauses between repeats.
 */
/** A client of one `opledger serve`, as the holder of one bearer token. */
export class Ledger {
    /**
     * @param {string} baseUrl e.g. `http://127.0.0.1:8080`
     * @param {LedgerOptions} options
     */
    constructor(baseUrl: string, options: LedgerOptions);
    baseUrl: string;
    timeoutMs: number;
    /** @private */
    private token;
    /** @private */
    private fetch;
    maxRetries: number;
    /** @private */
    private sleep;
    /**
     * Records an intent without sending anything. Every record carries an `Idempotency-Key`: the
     * one given (the same on a retry finds the operation the first call recorded), else a fresh
     * random one, so even a caller that names nothing can repeat a record whose answer it lost.
     * @param {Intent} intent
     * @param {{ idempotencyKey?: string }} [options]
     * @returns {Promise<Answer>}
     */
    record(intent: Intent, options?: {
        idempotencyKey?: string;
    }): Promise<Answer>;
    /**
     * Records an intent and executes it in the same call, waiting at most `waitMs` for the outcome.
     * @param {Intent} intent
     * @param {{ idempotencyKey?: string, waitMs?: number }} [options]
     * @returns {Promise<Answer>}
     */
    recordAndExecute(intent: Intent, options?: {
        idempotencyKey?: string;
        waitMs?: number;
    }): Promise<Answer>;
    /**
     * Drives a recorded operation and waits (at most `waitMs`) for its outcome.
     * @param {string} operationId
     * @param {{ waitMs?: number }} [options]
     * @returns {Promise<Operation>}
     */
    execute(operationId: string, options?: {
        waitMs?: number;
    }): Promise<Operation>;
    /**
     * Waits until the operation settles (succeeded, rejected, denied, abandoned) and answers it,
     * like Temporal's `handle.result()`; throws {@link WaitTimedOut} (with where it stood) after
     * `timeoutMs`. An operation with a person (`needs_review`) waits for them.
     * @param {string} operationId
     * @param {{ timeoutMs?: number }} [options]
     * @returns {Promise<Operation>}
     */
    waitFor(operationId: string, options?: {
        timeoutMs?: number;
    }): Promise<Operation>;
    /**
     * Where an operation stands now, or as of a moment (a global position or an RFC 3339 time).
     * @param {string} operationId
     * @param {{ asOf?: string | number }} [options]
     * @returns {Promise<Operation>}
     */
    status(operationId: string, options?: {
        asOf?: string | number;
    }): Promise<Operation>;
    /**
     * One operation's whole history, event by event.
     * @param {string} operationId
     * @returns {Promise<History>}
     */
    history(operationId: string): Promise<History>;
    /**
     * A page of operations from the read models; pass `next` back as `after` for the next page.
     * @param {{ state?: State, olderThan?: string, tenant?: string, provider?: string, account?: string, limit?: number, after?: string }} [filter]
     * @returns {Promise<OperationPage>}
     */
    list(filter?: {
        state?: State;
        olderThan?: string;
        tenant?: string;
        provider?: string;
        account?: string;
        limit?: number;
        after?: string;
    }): Promise<OperationPage>;
    /**
     * Every operation matching `filter`, page after page.
     * @param {Parameters<Ledger["list"]>[0]} [filter]
     * @returns {AsyncGenerator<components["schemas"]["ListItem"]>}
     */
    listAll(filter?: Parameters<Ledger["list"]>[0]): AsyncGenerator<components["schemas"]["ListItem"]>;
    /**
     * The chain behind an operation, attempt, external object or source id.
     * @param {string} id
     * @returns {Promise<Trace>}
     */
    trace(id: string): Promise<Trace>;
    /**
     * The operator's queue: unknown and needs-review operations with their evidence.
     * @param {{ limit?: number }} [options]
     * @returns {Promise<ReviewQueue>}
     */
    reviewQueue(options?: {
        limit?: number;
    }): Promise<ReviewQueue>;
    /**
     * An operator's decision on an operation in the queue: retry, confirm (with the object's id)
     * or abandon.
     * @param {string} operationId
     * @param {ReviewRequest} decision
     * @returns {Promise<Operation>}
     */
    review(operationId: string, decision: ReviewRequest): Promise<Operation>;
    /**
     * Approves the recorded snapshot (its `args_hash`, from the operation) for sending.
     * @param {string} operationId
     * @param {components["schemas"]["ApproveRequest"]} approval
     * @returns {Promise<Operation>}
     */
    approve(operationId: string, approval: components["schemas"]["ApproveRequest"]): Promise<Operation>;
    /**
     * Denies the recorded snapshot, with the reason.
     * @param {string} operationId
     * @param {components["schemas"]["DenyRequest"]} denial
     * @returns {Promise<Operation>}
     */
    deny(operationId: string, denial: components["schemas"]["DenyRequest"]): Promise<Operation>;
    /**
     * The configured actions this tenant may use, each described as a tool.
     * @returns {Promise<Action[]>}
     */
    actions(): Promise<Action[]>;
    /**
     * Operations per state.
     * @param {{ tenant?: string }} [options]
     * @returns {Promise<Counts>}
     */
    counts(options?: {
        tenant?: string;
    }): Promise<Counts>;
    /** @returns {Promise<Principal>} Who this client's token stands for. */
    whoami(): Promise<Principal>;
    /**
     * The outcome feed (Server-Sent Events), as an async iterator of events. It resumes by itself:
     * when the stream ends or breaks, it reconnects with `Last-Event-ID` set to the last event it
     * yielded, so no event is skipped or repeated; pass the last `position` you processed as
     * `after` to resume across restarts. Stop it with `signal` (or by leaving the loop). After
     * `maxReconnects` (default {@link MAX_CONSECUTIVE_RECONNECTS}) reconnections in a row without
     * an event it throws a LedgerError naming the position to resume from.
     * @param {{ types?: string[], after?: number, signal?: AbortSignal, reconnectMs?: number, maxReconnects?: number }} [options]
     * @returns {AsyncGenerator<OutcomeEvent>}
     */
    outcomes(options?: {
        types?: string[];
        after?: number;
        signal?: AbortSignal;
        reconnectMs?: number;
        maxReconnects?: number;
    }): AsyncGenerator<OutcomeEvent>;
    /**
     * One configured action as a guarded tool: `run(args, { requestId })` records and executes the
     * action once under the request id (the agent framework's own tool-call id, the same on a
     * retry) and answers the ledger's sentence. An outcome that is not confirmed is an answer, not
     * an error ("… has not confirmed … yet; … Please do not repeat it."), so a framework does not
     * retry it; a refusal before anything was recorded (arguments off the schema) throws.
     * @param {Action | { provider: string, account: string, action: string }} action an entry of
     *   `actions()`, or the provider, account and action by name
     * @param {{ waitMs?: number }} [options]
     */
    guardedTool(action: Action | {
        provider: string;
        account: string;
        action: string;
    }, options?: {
        waitMs?: number;
    }): {
        /** The tool's name (`<provider>__<action>`). */
        name: string;
        /**
         * @param {Record<string, unknown>} args the model's arguments (with `account` among them
         *   when the action lists several accounts)
         * @param {{ requestId?: string }} [call]
         * @returns {Promise<{ text: string, operation: Answer }>}
         */
        run(args: Record<string, unknown>, call?: {
            requestId?: string;
        }): Promise<{
            text: string;
            operation: Answer;
        }>;
        /**
         * `run` for a framework adapter: a refusal is the API's message as text (`refused`), which
         * the adapter hands to the model as the framework's tool error; a ledger that never
         * answered, even after the client's repeats, is an answer like an unknown outcome ("not
         * confirmed: do not repeat it"), never an error inviting a call under a new tool-call id.
         * @param {Record<string, unknown>} args
         * @param {{ requestId?: string }} [call]
         * @returns {Promise<{ text: string, refused: boolean, error?: LedgerError }>}
         */
        answer(args: Record<string, unknown>, call?: {
            requestId?: string;
        }): Promise<{
            text: string;
            refused: boolean;
            error?: LedgerError;
        }>;
    };
    /**
     * Guards a function of your own that has a side effect (a charge, an e-mail): the ledger
     * records the call as a step, the function runs once while this process holds the step's
     * claim, and what it made is recorded. The wrapper resolves to the recorded result (a string).
     *
     * The function is called with its arguments and then a {@link StepContext} (its
     * `idempotencyKey` to pass on). A call is named by `options.key(...args)`, else by its
     * arguments; a repeat under the same name resolves to the recorded result without running the
     * function, a recorded failure throws {@link StepFailed}, and a step whose outcome was lost
     * (the process died after the function ran) throws {@link StepNotConfirmed} and is never run
     * again: a person decides. An error from the function is recorded ({@link StepDidNotApply}:
     * nothing took effect; anything else: it may have) and thrown again.
     * @template {unknown[]} A
     * @param {StepOptions} options
     * @param {(...args: [...A, StepContext]) => unknown} fn
     * @returns {((...args: A) => Promise<string>) & { lastOperation?: Operation }}
     */
    step<A extends unknown[]>(options: StepOptions, fn: (...args: [...A, StepContext]) => unknown): ((...args: A) => Promise<string>) & {
        lastOperation?: Operation;
    };
    #private;
}
export type Operation = components["schemas"]["Operation"];
export type State = components["schemas"]["State"];
export type OperationPage = components["schemas"]["OperationPage"];
export type History = components["schemas"]["History"];
export type Trace = components["schemas"]["Trace"];
export type ReviewQueue = components["schemas"]["ReviewQueue"];
export type ReviewRequest = components["schemas"]["ReviewRequest"];
export type OutcomeEvent = components["schemas"]["OutcomeEvent"];
export type Action = components["schemas"]["Action"];
export type Counts = components["schemas"]["Counts"];
export type Principal = components["schemas"]["Principal"];
export type ErrorCode = components["schemas"]["ErrorCode"];
/**
 * What to record: the provider, the account, the action and its arguments.
 */
export type Intent = {
    provider: string;
    account: string;
    action: string;
    args: Record<string, unknown>;
    owner?: string | undefined;
    requires_approval?: boolean | undefined;
};
/**
 * An answer about one operation, with what the HTTP exchange said beside it.
 */
export type Answer = Operation & {
    replayed: boolean;
};
/**
 * How a step is guarded.
 */
export type StepOptions = {
    /**
     * your code's system, e.g. `billing` (not a configured connector)
     */
    provider: string;
    /**
     * what the function does there, e.g. `charge`
     */
    action: string;
    /**
     * names a call from its arguments (default: the
     * arguments themselves)
     */
    key?: ((...args: any[]) => string) | undefined;
    /**
     * what the result is recorded as
     */
    resultId?: ((result: any) => string | number) | undefined;
    /**
     * how long the claim holds without an outcome
     */
    leaseMs?: number | undefined;
    /**
     * your name for this process, recorded with the attempt
     */
    caller?: string | undefined;
};
/**
 * What a guarded function is given besides its arguments: the step's key, the same on every
 * attempt, to pass on to its own system.
 */
export type StepContext = {
    idempotencyKey: string;
    operationId: string;
    attemptId: string;
};
export type LedgerOptions = {
    /**
     * A tenant's (or an operator's, an approver's) bearer token.
     */
    token: string;
    /**
     * The fetch to use (default: the global one).
     */
    fetch?: typeof fetch | undefined;
    /**
     * One request's limit, in milliseconds.
     */
    timeoutMs?: number | undefined;
    /**
     * How often a request safe to repeat is repeated (default 2).
     */
    maxRetries?: number | undefined;
    /**
     * How the client pauses between repeats.
     */
    sleep?: ((ms: number) => Promise<void>) | undefined;
};
import type { components } from "../types/openapi.js";
