// `ledger.step` against a real `opledger serve`: a function of the caller's own is recorded, run
// once with the step's key while its claim is held, and its result recorded; a repeat resolves to
// the recorded result without running it, and a failure that may have taken effect is never run
// again. (A process killed mid-step is tests/serve/steps.rs's, in Python.)

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { StepNotConfirmed } from "../src/index.js";
import { ledger } from "./support.js";

test("a guarded function runs once with the step's key, and a repeat resolves to its recorded result", async () => {
  const client = ledger();
  /** @type {string[]} */
  const keys = [];
  const charge = client.step({ provider: "billing", action: "charge" }, async (/** @type {{ order: string, amountCents: number }} */ order, context) => {
    keys.push(context.idempotencyKey);
    return { id: `inv-${order.order}`, amountCents: order.amountCents };
  });
  const order = { order: randomUUID(), amountCents: 700 };
  assert.equal(await charge(order), `inv-${order.order}`);
  assert.equal(charge.lastOperation?.state, "succeeded");
  assert.deepEqual(charge.lastOperation?.args, order);
  assert.equal(charge.lastOperation?.idempotency_key, keys[0]);
  assert.equal(await charge(order), `inv-${order.order}`);
  assert.equal(keys.length, 1, "the function ran once");
});

test("a failure that may have taken effect is recorded and never run again", async () => {
  const client = ledger();
  let runs = 0;
  const send = client.step({ provider: "mail", action: "send", key: (/** @type {string} */ to) => `mail-${to}` }, async () => {
    runs += 1;
    throw new Error("the mail server did not answer");
  });
  const to = `${randomUUID()}@example.com`;
  await assert.rejects(send(to), /did not answer/);
  await assert.rejects(send(to), (error) => error instanceof StepNotConfirmed && error.operation.state === "needs_review");
  assert.equal(runs, 1);
});
