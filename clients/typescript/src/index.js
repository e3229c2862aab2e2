// A typed client of opledger's HTTP API (`opledger serve`) for agents written in TypeScript or
// JavaScript: record an intent, execute it, read where it stands, list, review, approve, follow
// the outcome feed, and guard one configured action as a tool whose retry finds the same
// operation and whose answer is the ledger's sentence.
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
 * The API refused a request (`{"error": {"code", "message"}}`, `status` the HTTP status), or
 * could not be reached (`status` 0, `code` "unreachable": whether a record arrived is unknown,
 * so repeat it with the same idempotency key).
 */
export class LedgerError extends Error {
  /**
   * @param {number} status
   * @param {ErrorCode | "unreachable" | "http_error"} code
   * @param {string} message
   * @param {{ pointer: string, message: string }[]} [fields]
   */
  constructor(status, code, message, fields) {
    super(`${status} ${code}: ${message}`);
    this.name = "LedgerError";
    this.status = status;
    this.code = code;
    this.detail = message;
    this.fields = fields ?? [];
  }

  /** Whether the same request may be repeated as it is (the server said so, or never answered). */
  get retryable() {
    return this.status === 0 || this.status === 503 || this.status === 429;
  }
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
    const { body } = await this.#call("POST", `/v1/operations/${segment(operationId)}/execute`, { query });
    return /** @type {Operation} */ (body);
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
        throw new LedgerError(0, "unreachable", `the outcome feed ended ${reconnects} times in a row; resume with after: ${last}`);
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
    };
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
    });
    const operation = /** @type {Operation} */ (body);
    return { ...operation, replayed: response.headers.get("Idempotent-Replayed") === "true" };
  }

  /**
   * @param {string} method
   * @param {string} path
   * @param {{ query?: Record<string, string>, body?: unknown, headers?: Record<string, string> }} [request]
   * @returns {Promise<{ body: unknown, response: Response }>}
   */
  async #call(method, path, request = {}) {
    const response = await this.#send(method, path, request);
    return { body: await response.json(), response };
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
      throw new LedgerError(0, "unreachable", `${method} ${url.pathname}: ${errorText(error)}; repeat the call with the same idempotency key`);
    }
    if (!response.ok) throw await apiError(response);
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
    throw new LedgerError(422, "invalid_input", `\`account\` must be one of ${action.accounts.join(", ")} (got ${JSON.stringify(account)}); nothing was recorded`);
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
    throw new LedgerError(422, "invalid_input", `the request id must be 1 to ${MAX_REQUEST_ID_BYTES} bytes; nothing was recorded`);
  }
  return requestId;
}

/** @param {Response} response */
async function apiError(response) {
  const text = await response.text();
  try {
    const { error } = /** @type {components["schemas"]["Error"]} */ (JSON.parse(text));
    return new LedgerError(response.status, error.code, error.message, error.fields);
  } catch {
    return new LedgerError(response.status, "http_error", text.slice(0, 500));
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
