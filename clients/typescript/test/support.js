// What every test stands on: the running `opledger serve` and CRM stand that the Rust test
// (tests/serve/typescript.rs) started, named by environment variables. A missing one fails the
// run: these tests never skip.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";

import { Ledger, notConfirmed } from "../src/index.js";

/** How long a test waits for an outcome before it fails, in milliseconds. */
export const DEADLINE_MS = 30_000;

/** @param {string} name */
export function env(name) {
  const value = process.env[name];
  assert.ok(value, `${name} is not set: run these tests through \`cargo test --test serve typescript\``);
  return value;
}

export const ledger = () => new Ledger(env("OPLEDGER_BASE_URL"), { token: env("OPLEDGER_TOKEN") });
export const operator = () => new Ledger(env("OPLEDGER_BASE_URL"), { token: env("OPLEDGER_OPERATOR_TOKEN") });
export const account = () => env("OPLEDGER_ACCOUNT");

/** A title no other test uses, so the stand's objects can be counted per test. */
export const title = (/** @type {string} */ what) => `${what} ${randomUUID()}`;

/** The CRM stand's admin API: queue a fault, list what it holds. */
export const stand = {
  /** @param {string} path @param {unknown} [body] */
  async call(path, body) {
    const response = await fetch(env("OPLEDGER_STAND_URL") + path, {
      method: body === undefined ? "GET" : "POST",
      headers: { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    assert.ok(response.ok, `the stand answered ${response.status} to ${path}`);
    return response.json();
  },
  /** The next POST to `shape` (`plain`, `keyed`) reaches the CRM, which loses its response. */
  async dropNextResponse(shape = "plain") {
    await this.call("/admin/faults", { shape, method: "POST", kind: "drop_response" });
  },
  /** @param {string} title @returns {Promise<{ id: string, fields: Record<string, unknown> }[]>} */
  async objectsTitled(title) {
    const { objects } = await this.call("/admin/objects");
    return objects.filter((/** @type {any} */ o) => o.fields.title === title);
  },
};

/**
 * Reads the operation until it settles; fails after the deadline.
 * @param {Ledger} client
 * @param {string} operationId
 */
export async function untilSettled(client, operationId) {
  const started = Date.now();
  for (;;) {
    const operation = await client.status(operationId);
    if (!notConfirmed(operation)) return operation;
    assert.ok(Date.now() - started < DEADLINE_MS, `${operationId} stayed ${operation.state}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** What the ledger says for an outcome it has not confirmed: never "Done", always "do not repeat". */
export function assertNotConfirmedSentence(/** @type {string} */ text) {
  assert.doesNotMatch(text, /^Done/);
  assert.match(text, /not confirmed/i);
  assert.match(text, /do not repeat/i);
}

/** A confirmed sentence naming the one object. */
export function assertDoneSentence(/** @type {string} */ text, /** @type {string} */ objectId) {
  assert.match(text, new RegExp(`^Done: .* object ${objectId}\\.$`));
}

/**
 * A real HTTP server on 127.0.0.1 in front of `opledger serve`: it passes requests on, and plays
 * the faults queued for the next POSTs to `/v1/operations` — `"503_after"` (the server records
 * it, then the answer is replaced by a 503 `outcome_unknown`), `"drop_after"` (the server records
 * it, then the connection closes without an answer). It keeps the Idempotency-Key of every POST.
 * @param {string} target
 */
export async function faultyProxy(target) {
  /** @type {string[]} */
  const faults = [];
  /** @type {(string | undefined)[]} */
  const keys = [];
  const server = createServer(async (request, response) => {
    /** @type {Buffer[]} */
    const chunks = [];
    for await (const chunk of request) chunks.push(chunk);
    let fault;
    if (request.method === "POST" && (request.url ?? "").split("?")[0] === "/v1/operations") {
      keys.push(/** @type {string | undefined} */ (request.headers["idempotency-key"]));
      fault = faults.shift();
    }
    /** @type {Record<string, string>} */
    const headers = {};
    for (const name of ["authorization", "content-type", "idempotency-key", "accept", "last-event-id"]) {
      const value = request.headers[name];
      if (typeof value === "string") headers[name] = value;
    }
    const answer = await fetch(target + request.url, {
      method: request.method,
      headers,
      body: chunks.length ? Buffer.concat(chunks) : undefined,
    });
    const body = Buffer.from(await answer.arrayBuffer());
    if (fault === "drop_after") {
      request.socket.destroy();
      return;
    }
    if (fault === "503_after") {
      response.writeHead(503, { "Content-Type": "application/json" });
      response.end(JSON.stringify({ error: { code: "outcome_unknown", message: "the append's outcome is unknown; repeat the same request: it is idempotent" } }));
      return;
    }
    /** @type {Record<string, string>} */
    const out = { "Content-Type": answer.headers.get("content-type") ?? "application/json" };
    const replayed = answer.headers.get("idempotent-replayed");
    if (replayed) out["Idempotent-Replayed"] = replayed;
    response.writeHead(answer.status, out);
    response.end(body);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = /** @type {import("node:net").AddressInfo} */ (server.address());
  return {
    url: `http://127.0.0.1:${address.port}`,
    faults,
    keys,
    close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(() => resolve(undefined)); }),
  };
}
