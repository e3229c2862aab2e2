// What every test stands on: the running `opledger serve` and CRM stand that the Rust test
// (tests/serve/typescript.rs) started, named by environment variables. A missing one fails the
// run: these tests never skip.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

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
