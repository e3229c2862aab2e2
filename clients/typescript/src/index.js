// A typed client of opledger's HTTP API (`opledger serve`) for agents written in TypeScript or
// JavaScript: record an intent, execute it, read where it stands, list, review, approve, follow
// the outcome feed, and guard one configured action as a tool whose retry finds the same
// operation and whose answer is the ledger's sentence; and guard a function of your own
// (`step`): recorded, run once under a claim, its outcome recorded, never run again once its
// outcome is lost.
//
// Written in JavaScript with JSDoc types that `tsc` checks (strict) against the types generated
// from the served OpenAPI document (types/openapi.d.ts): the package runs as it is on Node 20
// without a build step, installs from the repository by path, and its declarations (types/) are
// emitted by tsc from these same comments. It must never add a runtime dependency: `fetch` only.

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
export const SETTLED_STATES = Object.freeze(
  /** @type {const} */ (["succeeded", "rejected", "denied", "abandoned"]),
);
/** States whose outcome is not known yet: never repeat the call; ask `status` later. */
export const NOT_CONFIRMED_STATES = Object.freeze(
  /** @type {const} */ (["pending", "in_flight", "unknown", "needs_review"]),
);
/**
 * How long one HTTP request may take, in milliseconds, unless the client is told otherwise:
 * longer than the server's largest `wait_ms` (30 s by default), so an execute answers first.
 */
export const DEFAULT_TIMEOUT_MS = 40_000;
/**
 * How many times in a row the outcome feed reconnects without receiving an event before it gives
 * up and throws (with the position to resume from): a server that is gone for good is reported,
 * not retried for ever.
 */
export const MAX_CONSECUTIVE_RECONNECTS = 20;
/** The pause before the outcome feed reconnects, in milliseconds. */
export const RECONNECT_PAUSE_MS = 500;
/** The longest request id a guarded tool sends as an `Idempotency-Key`, in bytes (TextId). */
export const MAX_REQUEST_ID_BYTES = 256;
/**
 * How many times a request that is safe to repeat is repeated after no answer, a timeout, a 503
 * or a 429 (Stripe's SDKs repeat twice by default). A record is repeated with the same
 * Idempotency-Key, so a repeat finds the operation the lost attempt recorded.
 */
export const DEFAULT_MAX_RETRIES = 2;
/** The first pause before a repeat, in milliseconds; each further one doubles, with full jitter. */
export const RETRY_BASE_MS = 500;
/** The longest pause before one repeat, in milliseconds. */
export const RETRY_CAP_MS = 8_000;
/** The first pause between two reads of `waitFor`, in milliseconds; it grows to one second. */
export const WAIT_POLL_MS = 50;

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
  constructor(status, code, message, fields, requestId) {
    super(`${status} ${code}: ${message}`);
    this.name = "LedgerError";
    this.status = status;
    this.code = code;
    this.detail = message;
    this.fields = fields ?? [];
    this.requestId = requestId;
  }

  /** Whether the same request may be repeated as it is (the server said so, or never answered). */
  get retryable() {
    return this.status === 0 || this.status === 503 || this.status === 429;
  }
}

/** 422 `invalid_input` (and the other malformed-request codes): fix the request. */
export class InvalidInput extends LedgerError {}
/** 409 `idempotency_key_reused` / `source_id_reused`: the key named another request. */
export class IdempotencyKeyReused extends LedgerError {}
/** 409: refused by the ledger's rules (`refused`, `stale`, `duplicate_risk_not_accepted`). */
export class Conflict extends LedgerError {}
/** 404: no such operation (or not this tenant's). */
export class NotFound extends LedgerError {}
/** 401 / 403: the token is unknown or may not do this. */
export class Unauthorized extends LedgerError {}
/** 429: too many requests at once; repeated by the client up to `maxRetries`. */
export class RateLimited extends LedgerError {}
/** 503, a timeout or no answer: repeated with the same key by the client up to `maxRetries`. */
export class Unavailable extends LedgerError {}
/**
 * A guarded step gave no result: `operation` is where the ledger says it stands, and
 * `operation.message` is what to tell the user.
 */
export class StepError extends LedgerError {
  /** @param {Operation} operation @param {`step_${string}`} code */
  constructor(operation, code) {
    super(409, code, operation.message);
    this.operation = operation;
  }
}
/** The step's function failed without taking effect (`rejected`); a repeat answers it again. */
export class StepFailed extends StepError {}
/**
 * Whether the step took effect is unknown (`unknown`, `needs_review`): its function is never run
 * again for this key; a person checks and decides.
 */
export class StepNotConfirmed extends StepError {}
/** Another process holds the step's claim now (`in_flight`): do not run it here. */
export class StepInProgress extends StepNotConfirmed {}
/**
 * Throw it from a guarded function when nothing took effect: the step is recorded as failed
 * (`rejected`), not as unknown. Any other error is recorded as "may have taken effect".
 */
export class StepDidNotApply extends Error {}

/** How long a step's claim holds without an outcome unless the step says otherwise, in ms. */
export const DEFAULT_STEP_LEASE_MS = 30_000;

/**
 * What a step already recorded answers: its result when it succeeded, `undefined` when it is
 * pending (claim it and run it), else the typed error.
 * @param {Operation} operation
 * @returns {string | undefined}
 */
function recordedAnswer(operation) {
  switch (operation.state) {
    case "succeeded":
      return /** @type {string} */ (operation.external_id);
    case "pending":
      return undefined;
    case "rejected":
      throw new StepFailed(operation, "step_failed");
    case "in_flight":
      throw new StepInProgress(operation, "step_in_progress");
    case "unknown":
    case "needs_review":
      throw new StepNotConfirmed(operation, "step_not_confirmed");
    default:
      throw new StepFailed(operation, `step_${operation.state}`);
  }
}

/**
 * What a guarded function's result is recorded as: itself when it is a string or a number, else
 * its `id`.
 * @param {unknown} result
 * @returns {string}
 */
function resultId(result) {
  if (typeof result === "string" || typeof result === "number") return String(result);
  const id = result !== null && typeof result === "object" ? /** @type {{ id?: unknown }} */ (result).id : undefined;
  if (typeof id === "string" || typeof id === "number") return String(id);
  throw new TypeError(`a guarded step must return what it made (an id: a string or a number, or an object with an \`id\`), or be given resultId to name it; it returned ${typeof result}`);
}

/**
 * The step's source id derived from its provider, action and arguments (SHA-256 of their JSON
 * with sorted keys), so a repeat of the same call finds the same step.
 * @param {string} provider @param {string} action @param {unknown[]} args
 */
async function derivedKey(provider, action, args) {
  const canonical = JSON.stringify([provider, action, args], (_, value) =>
    value && typeof value === "object" && !Array.isArray(value)
      ? Object.fromEntries(Object.entries(value).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))
      : value,
  );
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(canonical));
  const hex = Array.from(new Uint8Array(digest), (byte) => byte.toString(16).padStart(2, "0")).join("");
  return `step-${hex.slice(0, 40)}`;
}

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
  constructor(operation, timeoutMs) {
    super(0, "wait_timed_out", `operation ${operation.operation_id} is still ${operation.state} after ${timeoutMs} ms; it is not confirmed: do not repeat it, ask its status later`);
    this.operation = operation;
  }
}

/** @type {Record<string, typeof LedgerError>} */
const BY_CODE = {
  idempotency_key_reused: IdempotencyKeyReused, source_id_reused: IdempotencyKeyReused,
  invalid_input: InvalidInput, malformed_json: InvalidInput, invalid_path: InvalidInput, too_large: InvalidInput,
  not_found: NotFound, unauthorized: Unauthorized, forbidden: Unauthorized,
};
/** @type {Record<number, typeof LedgerError>} */
const BY_STATUS = {
  0: Unavailable, 400: InvalidInput, 401: Unauthorized, 403: Unauthorized, 404: NotFound, 409: Conflict,
  413: InvalidInput, 422: InvalidInput, 429: RateLimited, 503: Unavailable,
};

/**
 * The typed error for an answer: by the API's code, else by the HTTP status.
 * @param {number} status
 * @param {ConstructorParameters<typeof LedgerError>[1]} code
 * @param {string} message
 * @param {{ pointer: string, message: string }[]} [fields]
 * @param {string} [requestId]
 * @returns {LedgerError}
 */
export function errorOf(status, code, message, fields, requestId) {
  const Kind = (status === 0 ? Unavailable : BY_CODE[code] ?? BY_STATUS[status]) ?? LedgerError;
  return new Kind(status, code, message, fields, requestId);
}

/**
 * What a guarded tool hands the model when the ledger refuses a call or never answers: the API's
 * own message, and what to do. Never "done".
 * @param {LedgerError} error
 */
export function refusalText(error) {
  if (error instanceof Unavailable) {
    return `The ledger did not answer (${error.code}: ${error.detail}). The call is not confirmed: do not repeat it with other arguments; ask for its status later.`;
  }
  return `The ledger refused the call (${error.code}): ${error.detail}`;
}

/** Whether `operation` is settled as confirmed: it succeeded and names the object. */
export function confirmed(/** @type {Operation} */ operation) {
  return operation.state === "succeeded" && operation.external_id !== null;
}

/** Whether `operation`'s outcome is not known yet: do not repeat it; ask `status` later. */
export function notConfirmed(/** @type {Operation} */ operation) {
  return /** @type {readonly string[]} */ (NOT_CONFIRMED_STATES).includes(operation.state);
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
  constructor(baseUrl, options) {
    if (!options?.token) {
      throw new TypeError("token is required: a tenant's token from the server's [[tenants]]");
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    /** @private */
    this.token = options.token;
    /** @private */
    this.fetch = options.fetch ?? globalThis.fetch;
    this.maxRetries = options.maxRetries ?? DEFAULT_MAX_RETRIES;
    /** @private */
    this.sleep = options.sleep ?? ((/** @type {number} */ ms) => pause(ms, undefined));
  }

  /**
   * Records an intent without sending anything. Every record carries an `Idempotency-Key`: the
   * one given (the same on a retry finds the operation the first call recorded), else a fresh
   * random one, so even a caller that names nothing can repeat a record whose answer it lost.
   * @param {Intent} intent
   * @param {{ idempotencyKey?: string }} [options]
   * @returns {Promise<Answer>}
   */
  async record(intent, options = {}) {
    return this.#record(intent, options.idempotencyKey, {});
  }

  /**
   * Records an intent and executes it in the same call, waiting at most `waitMs` for the outcome.
   * @param {Intent} intent
   * @param {{ idempotencyKey?: string, waitMs?: number }} [options]
   * @returns {Promise<Answer>}
   */
  async recordAndExecute(intent, options = {}) {
    /** @type {Record<string, string>} */
    const query = { execute: "true" };
    if (options.waitMs !== undefined) query.wait_ms = String(options.waitMs);
    return this.#record(intent, options.idempotencyKey, query);
  }

  /**
   * Drives a recorded operation and waits (at most `waitMs`) for its outcome.
   * @param {string} operationId
   * @param {{ waitMs?: number }} [options]
   * @returns {Promise<Operation>}
   */
  async execute(operationId, options = {}) {
    const query = defined({ wait_ms: options.waitMs === undefined ? undefined : String(options.waitMs) });
    // Executing is idempotent by the operation's id: a repeat drives the same operation.
    const { body } = await this.#call("POST", `/v1/operations/${segment(operationId)}/execute`, { query, retry: true });
    return /** @type {Operation} */ (body);
  }

  /**
   * Waits until the operation settles (succeeded, rejected, denied, abandoned) and answers it,
   * like Temporal's `handle.result()`; throws {@link WaitTimedOut} (with where it stood) after
   * `timeoutMs`. An operation with a person (`needs_review`) waits for them.
   * @param {string} operationId
   * @param {{ timeoutMs?: number }} [options]
   * @returns {Promise<Operation>}
   */
  async waitFor(operationId, options = {}) {
    const timeoutMs = options.timeoutMs ?? 30_000;
    const deadline = Date.now() + timeoutMs;
    let wait = WAIT_POLL_MS;
    for (;;) {
      const operation = await this.status(operationId);
      if (/** @type {readonly string[]} */ (SETTLED_STATES).includes(operation.state)) return operation;
      const left = deadline - Date.now();
      if (left <= 0) throw new WaitTimedOut(operation, timeoutMs);
      await this.sleep(Math.min(wait, left));
      wait = Math.min(wait * 2, 1_000);
    }
  }

  /**
   * Where an operation stands now, or as of a moment (a global position or an RFC 3339 time).
   * @param {string} operationId
   * @param {{ asOf?: string | number }} [options]
   * @returns {Promise<Operation>}
   */
  async status(operationId, options = {}) {
    const query = defined({ as_of: options.asOf === undefined ? undefined : String(options.asOf) });
    const { body } = await this.#call("GET", `/v1/operations/${segment(operationId)}`, { query });
    return /** @type {Operation} */ (body);
  }

  /**
   * One operation's whole history, event by event.
   * @param {string} operationId
   * @returns {Promise<History>}
   */
  async history(operationId) {
    const { body } = await this.#call("GET", `/v1/operations/${segment(operationId)}/events`);
    return /** @type {History} */ (body);
  }

  /**
   * A page of operations from the read models; pass `next` back as `after` for the next page.
   * @param {{ state?: State, olderThan?: string, tenant?: string, provider?: string, account?: string, limit?: number, after?: string }} [filter]
   * @returns {Promise<OperationPage>}
   */
  async list(filter = {}) {
    const query = defined({
      state: filter.state,
      older_than: filter.olderThan,
      tenant: filter.tenant,
      provider: filter.provider,
      account: filter.account,
      limit: filter.limit === undefined ? undefined : String(filter.limit),
      after: filter.after,
    });
    const { body } = await this.#call("GET", "/v1/operations", { query });
    return /** @type {OperationPage} */ (body);
  }

  /**
   * Every operation matching `filter`, page after page.
   * @param {Parameters<Ledger["list"]>[0]} [filter]
   * @returns {AsyncGenerator<components["schemas"]["ListItem"]>}
   */
  async *listAll(filter = {}) {
    let after = filter.after;
    for (;;) {
      const page = await this.list({ ...filter, after });
      yield* page.operations;
      if (page.next === null) return;
      after = page.next;
    }
  }

  /**
   * The chain behind an operation, attempt, external object or source id.
   * @param {string} id
   * @returns {Promise<Trace>}
   */
  async trace(id) {
    const { body } = await this.#call("GET", `/v1/trace/${segment(id)}`);
    return /** @type {Trace} */ (body);
  }

  /**
   * The operator's queue: unknown and needs-review operations with their evidence.
   * @param {{ limit?: number }} [options]
   * @returns {Promise<ReviewQueue>}
   */
  async reviewQueue(options = {}) {
    const query = defined({ limit: options.limit === undefined ? undefined : String(options.limit) });
    const { body } = await this.#call("GET", "/v1/review", { query });
    return /** @type {ReviewQueue} */ (body);
  }

  /**
   * An operator's decision on an operation in the queue: retry, confirm (with the object's id)
   * or abandon.
   * @param {string} operationId
   * @param {ReviewRequest} decision
   * @returns {Promise<Operation>}
   */
  async review(operationId, decision) {
    const { body } = await this.#call("POST", `/v1/operations/${segment(operationId)}/review`, { body: decision });
    return /** @type {Operation} */ (body);
  }

  /**
   * Approves the recorded snapshot (its `args_hash`, from the operation) for sending.
   * @param {string} operationId
   * @param {components["schemas"]["ApproveRequest"]} approval
   * @returns {Promise<Operation>}
   */
  async approve(operationId, approval) {
    const { body } = await this.#call("POST", `/v1/operations/${segment(operationId)}/approve`, { body: approval });
    return /** @type {Operation} */ (body);
  }

  /**
   * Denies the recorded snapshot, with the reason.
   * @param {string} operationId
   * @param {components["schemas"]["DenyRequest"]} denial
   * @returns {Promise<Operation>}
   */
  async deny(operationId, denial) {
    const { body } = await this.#call("POST", `/v1/operations/${segment(operationId)}/deny`, { body: denial });
    return /** @type {Operation} */ (body);
  }

  /**
   * The configured actions this tenant may use, each described as a tool.
   * @returns {Promise<Action[]>}
   */
  async actions() {
    const { body } = await this.#call("GET", "/v1/actions");
    return /** @type {components["schemas"]["Actions"]} */ (body).actions;
  }

  /**
   * Operations per state.
   * @param {{ tenant?: string }} [options]
   * @returns {Promise<Counts>}
   */
  async counts(options = {}) {
    const { body } = await this.#call("GET", "/v1/counts", { query: defined({ tenant: options.tenant }) });
    return /** @type {Counts} */ (body);
  }

  /** @returns {Promise<Principal>} Who this client's token stands for. */
  async whoami() {
    const { body } = await this.#call("GET", "/v1/whoami");
    return /** @type {Principal} */ (body);
  }

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
  async *outcomes(options = {}) {
    let last = options.after;
    let reconnects = 0;
    const maxReconnects = options.maxReconnects ?? MAX_CONSECUTIVE_RECONNECTS;
    for (;;) {
      /** @type {Record<string, string>} */
      const headers = { Accept: "text/event-stream" };
      if (last !== undefined) headers["Last-Event-ID"] = String(last);
      const query = defined({ types: options.types?.join(",") });
      let response;
      try {
        response = await this.#send("GET", "/v1/events", { query, headers, signal: options.signal, stream: true });
      } catch (error) {
        if (options.signal?.aborted || !(error instanceof LedgerError) || !error.retryable) throw error;
        response = null;
      }
      if (response?.body) {
        try {
          for await (const event of serverSentEvents(response.body)) {
            if (event.data === "") continue;
            const outcome = /** @type {OutcomeEvent} */ (JSON.parse(event.data));
            last = event.id === undefined ? outcome.position : Number(event.id);
            reconnects = 0;
            yield outcome;
          }
        } catch (error) {
          if (options.signal?.aborted) return;
          // A broken stream is resumed below from the last event yielded.
          if (!(error instanceof TypeError) && !isAbort(error)) throw error;
        }
      }
      if (options.signal?.aborted) return;
      reconnects += 1;
      if (reconnects > maxReconnects) {
        throw new Unavailable(0, "unreachable", `the outcome feed ended ${reconnects} times in a row; resume with after: ${last}`);
      }
      await pause(options.reconnectMs ?? RECONNECT_PAUSE_MS, options.signal);
    }
  }

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
  guardedTool(action, options = {}) {
    const ledger = this;
    return {
      /** The tool's name (`<provider>__<action>`). */
      name: "name" in action ? action.name : `${action.provider}__${action.action}`,
      /**
       * @param {Record<string, unknown>} args the model's arguments (with `account` among them
       *   when the action lists several accounts)
       * @param {{ requestId?: string }} [call]
       * @returns {Promise<{ text: string, operation: Answer }>}
       */
      async run(args, call = {}) {
        const { account, rest } = accountOf(action, args);
        const operation = await ledger.recordAndExecute(
          { provider: action.provider, account, action: action.action, args: rest },
          { idempotencyKey: requestKey(call.requestId), waitMs: options.waitMs },
        );
        return { text: sentenceOf(operation), operation };
      },
      /**
       * `run` for a framework adapter: a refusal is the API's message as text (`refused`), which
       * the adapter hands to the model as the framework's tool error; a ledger that never
       * answered, even after the client's repeats, is an answer like an unknown outcome ("not
       * confirmed: do not repeat it"), never an error inviting a call under a new tool-call id.
       * @param {Record<string, unknown>} args
       * @param {{ requestId?: string }} [call]
       * @returns {Promise<{ text: string, refused: boolean, error?: LedgerError }>}
       */
      async answer(args, call = {}) {
        try {
          return { text: (await this.run(args, call)).text, refused: false };
        } catch (error) {
          if (!(error instanceof LedgerError)) throw error;
          return { text: refusalText(error), refused: !(error instanceof Unavailable), error };
        }
      },
    };
  }

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
  step(options, fn) {
    const ledger = this;
    const leaseMs = options.leaseMs ?? DEFAULT_STEP_LEASE_MS;
    /** @type {((...args: A) => Promise<string>) & { lastOperation?: Operation }} */
    const guarded = async (...args) => {
      const name = options.key ? options.key(...args) : await derivedKey(options.provider, options.action, args);
      const args_ = stepArguments(args);
      const { body: recordedBody } = await ledger.#call("POST", "/v1/steps", {
        body: { provider: options.provider, action: options.action, args: args_ },
        headers: { "Idempotency-Key": name },
        retry: true,
      });
      let operation = /** @type {Operation} */ (recordedBody);
      guarded.lastOperation = operation;
      const recorded = recordedAnswer(operation);
      if (recorded !== undefined) return recorded;
      /** @type {{ attempt_id: string, idempotency_key: string }} */
      let claim;
      try {
        const claimBody = { attempt_id: crypto.randomUUID(), lease_ms: leaseMs, ...(options.caller ? { caller: options.caller } : {}) };
        const { body } = await ledger.#call("POST", `/v1/operations/${segment(operation.operation_id)}/claim`, { body: claimBody, retry: true });
        claim = /** @type {{ attempt_id: string, idempotency_key: string }} */ (body);
      } catch (error) {
        if (!(error instanceof Conflict)) throw error;
        operation = await ledger.status(operation.operation_id);
        guarded.lastOperation = operation;
        return recordedAnswer(operation) ?? notClaimed(operation);
      }
      const outcomePath = `/v1/operations/${segment(operation.operation_id)}/attempts/${segment(claim.attempt_id)}/outcome`;
      const report = async (/** @type {Record<string, string>} */ outcome) => {
        const { body } = await ledger.#call("POST", outcomePath, { body: outcome, retry: true });
        guarded.lastOperation = /** @type {Operation} */ (body);
        return guarded.lastOperation;
      };
      let result;
      try {
        result = await fn(...args, { idempotencyKey: claim.idempotency_key, operationId: operation.operation_id, attemptId: claim.attempt_id });
      } catch (error) {
        const applied = error instanceof StepDidNotApply ? "no" : "unknown";
        const code = error instanceof Error ? error.name || "Error" : "Error";
        await report({ outcome: "failed", applied, code, message: errorText(error).slice(0, 4000) }).catch(() => {
          // Unreported, its claim runs out: the step becomes unknown, and a person decides.
        });
        throw error;
      }
      const id = options.resultId ? String(options.resultId(result)) : resultId(result);
      const settled = await report({ outcome: "succeeded", external_id: id });
      return recordedAnswer(settled) ?? notClaimed(settled);
    };
    return guarded;
  }

  /**
   * @param {Intent} intent
   * @param {string | undefined} key
   * @param {Record<string, string>} query
   * @returns {Promise<Answer>}
   */
  async #record(intent, key, query) {
    const idempotencyKey = key ?? crypto.randomUUID();
    const { body, response } = await this.#call("POST", "/v1/operations", {
      query,
      body: intent,
      headers: { "Idempotency-Key": idempotencyKey },
      retry: true,
    });
    const operation = /** @type {Operation} */ (body);
    return { ...operation, replayed: response.headers.get("Idempotent-Replayed") === "true" };
  }

  /**
   * One request and its JSON answer, repeated up to `maxRetries` times when that is safe: a read,
   * or a request named by an Idempotency-Key (`retry`), after no answer, a timeout, a 503 or a
   * 429. Pauses grow exponentially with full jitter, capped.
   * @param {string} method
   * @param {string} path
   * @param {{ query?: Record<string, string>, body?: unknown, headers?: Record<string, string>, retry?: boolean }} [request]
   * @returns {Promise<{ body: unknown, response: Response }>}
   */
  async #call(method, path, request = {}) {
    const repeatable = request.retry ?? method === "GET";
    for (let attempt = 0; ; attempt += 1) {
      try {
        const response = await this.#send(method, path, request);
        try {
          return { body: await response.json(), response };
        } catch (error) {
          // The answer broke off while it was being read: as unknown as no answer at all.
          throw new Unavailable(0, "unreachable", `${method} ${path}: ${errorText(error)}; repeat the call with the same idempotency key`, undefined, request.headers?.["Idempotency-Key"]);
        }
      } catch (error) {
        if (!(error instanceof LedgerError && error.retryable && repeatable && attempt < this.maxRetries)) throw error;
      }
      await this.sleep(Math.random() * Math.min(RETRY_CAP_MS, RETRY_BASE_MS * 2 ** attempt));
    }
  }

  /**
   * Sends one request; a refusal becomes a LedgerError with the API's code.
   * @param {string} method
   * @param {string} path
   * @param {{ query?: Record<string, string>, body?: unknown, headers?: Record<string, string>, signal?: AbortSignal, stream?: boolean }} request
   * @returns {Promise<Response>}
   */
  async #send(method, path, request) {
    const url = new URL(this.baseUrl + path);
    for (const [name, value] of Object.entries(request.query ?? {})) url.searchParams.set(name, value);
    /** @type {Record<string, string>} */
    const headers = { Authorization: `Bearer ${this.token}`, ...request.headers };
    if (request.body !== undefined) headers["Content-Type"] = "application/json";
    // A stream is bounded by its caller's signal, not by one request's time.
    const timeout = request.stream ? undefined : AbortSignal.timeout(this.timeoutMs);
    const signals = [timeout, request.signal].filter((s) => s !== undefined);
    let response;
    try {
      response = await this.fetch(url, {
        method,
        headers,
        body: request.body === undefined ? undefined : JSON.stringify(request.body),
        signal: signals.length ? AbortSignal.any(signals) : undefined,
      });
    } catch (error) {
      if (request.signal?.aborted) throw error;
      // Whether a POST reached the server is unknown: the same key finds it if it did.
      const code = timeout?.aborted ? "timeout" : "unreachable";
      throw new Unavailable(0, code, `${method} ${url.pathname}: ${errorText(error)}; repeat the call with the same idempotency key`, undefined, request.headers?.["Idempotency-Key"]);
    }
    if (!response.ok) throw await apiError(response, request.headers?.["Idempotency-Key"]);
    return response;
  }
}

/**
 * What a guarded tool answers: the ledger's sentence, and for a send not confirmed yet (its
 * sentence says so but gives no advice) that it must not be repeated, as the MCP tools say.
 * @param {Operation} operation
 */
export function sentenceOf(operation) {
  if (operation.state === "pending" || operation.state === "in_flight") {
    return `${operation.message} Not confirmed yet: do not repeat the call (operation ${operation.operation_id}).`;
  }
  return operation.message;
}

/**
 * A step's arguments as the ledger records them (a JSON object): a single plain object as it
 * is, anything else by position (`{"0": …, "1": …}`).
 * @param {unknown[]} args
 * @returns {Record<string, unknown>}
 */
function stepArguments(args) {
  const [only] = args;
  if (args.length === 1 && only !== null && typeof only === "object" && !Array.isArray(only)) {
    return /** @type {Record<string, unknown>} */ (only);
  }
  return Object.fromEntries(args.map((value, index) => [String(index), value]));
}

/**
 * A step that is neither settled nor claimable here after all.
 * @param {Operation} operation
 * @returns {never}
 */
function notClaimed(operation) {
  throw new StepNotConfirmed(operation, "step_not_confirmed");
}

/**
 * The account an action tool call acts in, and the action's own arguments.
 * @param {Action | { account: string }} action
 * @param {Record<string, unknown>} args
 */
function accountOf(action, args) {
  if (!("accounts" in action)) return { account: action.account, rest: args };
  const [only, ...others] = action.accounts;
  if (others.length === 0) return { account: only, rest: args };
  const { account, ...rest } = args;
  if (typeof account !== "string" || !action.accounts.includes(account)) {
    throw new InvalidInput(422, "invalid_input", `\`account\` must be one of ${action.accounts.join(", ")} (got ${JSON.stringify(account)}); nothing was recorded`);
  }
  return { account, rest };
}

/**
 * The Idempotency-Key for a framework's tool-call id: the id itself while it fits a TextId.
 * @param {string | undefined} requestId
 */
function requestKey(requestId) {
  if (requestId === undefined) return undefined;
  if (requestId.length === 0 || new TextEncoder().encode(requestId).length > MAX_REQUEST_ID_BYTES) {
    throw new InvalidInput(422, "invalid_input", `the request id must be 1 to ${MAX_REQUEST_ID_BYTES} bytes; nothing was recorded`);
  }
  return requestId;
}

/**
 * @param {Response} response
 * @param {string | undefined} requestId
 */
async function apiError(response, requestId) {
  const text = await response.text();
  try {
    const { error } = /** @type {components["schemas"]["Error"]} */ (JSON.parse(text));
    return errorOf(response.status, error.code, error.message, error.fields, requestId);
  } catch {
    return errorOf(response.status, "http_error", text.slice(0, 500), undefined, requestId);
  }
}

/**
 * Server-Sent Events from a byte stream, as the WHATWG parsing rules read them.
 * @param {ReadableStream<Uint8Array>} body
 * @returns {AsyncGenerator<{ id?: string, event?: string, data: string }>}
 */
export async function* serverSentEvents(body) {
  const decoder = new TextDecoder();
  let buffer = "";
  /** @type {{ id?: string, event?: string, data: string[] }} */
  let event = { data: [] };
  // Node's web streams are async iterable; the DOM typings do not say so.
  for await (const chunk of /** @type {AsyncIterable<Uint8Array>} */ (/** @type {unknown} */ (body))) {
    buffer += decoder.decode(chunk, { stream: true });
    let end;
    while ((end = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + (buffer.startsWith("\r\n", end) ? 2 : 1));
      if (line === "") {
        if (event.data.length > 0) yield { id: event.id, event: event.event, data: event.data.join("\n") };
        event = { data: [] };
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "data") event.data.push(value);
      else if (field === "id") event.id = value;
      else if (field === "event") event.event = value;
    }
  }
}

/** @param {Record<string, string | undefined>} query */
function defined(query) {
  /** @type {Record<string, string>} */
  const kept = {};
  for (const [name, value] of Object.entries(query)) if (value !== undefined) kept[name] = value;
  return kept;
}

/** @param {string} id */
function segment(id) {
  return encodeURIComponent(id);
}

/** @param {unknown} error */
function errorText(error) {
  const cause = error instanceof Error && error.cause instanceof Error ? ` (${error.cause.message})` : "";
  return error instanceof Error ? `${error.message}${cause}` : String(error);
}

/** @param {unknown} error */
function isAbort(error) {
  return error instanceof Error && (error.name === "AbortError" || error.name === "TimeoutError");
}

/**
 * @param {number} ms
 * @param {AbortSignal | undefined} signal
 */
function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve(undefined);
    }, { once: true });
  });
}
