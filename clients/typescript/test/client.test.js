// The client against a real `opledger serve` and the CRM stand: record / execute / status with
// the Idempotency-Key, typed errors with the API's codes, listings and history, approval and
// review, the outcome feed resumed with Last-Event-ID, and the guarded tool across a lost
// response.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import {
  IdempotencyKeyReused, InvalidInput, LedgerError, Ledger, NotFound, Unauthorized, Unavailable, WaitTimedOut,
  confirmed, notConfirmed,
} from "../src/index.js";
import {
  account, assertDoneSentence, assertNotConfirmedSentence, env, faultyProxy, ledger, operator, stand, title, untilSettled,
} from "./support.js";

test("a recorded intent is executed and its status names the object", async () => {
  const client = ledger();
  const recorded = await client.record({ provider: "crm", account: account(), action: "create_task", args: { title: title("Call") } });
  assert.equal(recorded.created, true);
  assert.equal(recorded.state, "pending");
  const done = await client.execute(recorded.operation_id, { waitMs: 5000 });
  assert.ok(confirmed(done), JSON.stringify(done));
  assertDoneSentence(done.message, String(done.external_id));
  const status = await client.status(recorded.operation_id);
  assert.equal(status.external_id, done.external_id);
  const history = await client.history(recorded.operation_id);
  assert.equal(history.state, "succeeded");
  assert.ok(history.events.some((event) => event.type === "AttemptSucceeded"));
});

test("every record carries an Idempotency-Key, so a repeat of a lost answer finds the operation", async () => {
  /** @type {string[]} */
  const keys = [];
  const client = new Ledger(env("OPLEDGER_BASE_URL"), {
    token: env("OPLEDGER_TOKEN"),
    fetch: async (url, init) => {
      const key = new Headers(init?.headers).get("Idempotency-Key");
      if (key) keys.push(key);
      return fetch(url, init);
    },
  });
  const recorded = await client.record({ provider: "crm", account: account(), action: "create_task", args: { title: title("Keyed") } });
  assert.equal(keys.length, 1);
  // The key is the request's source id (one namespace with the API's source ids).
  assert.equal(recorded.source_id, keys[0]);
  const again = await client.record(
    { provider: "crm", account: account(), action: "create_task", args: recorded.args },
    { idempotencyKey: keys[0] },
  );
  assert.equal(again.operation_id, recorded.operation_id);
  assert.equal(again.replayed, true);
  assert.equal(again.created, false);
});

test("refusals are typed errors carrying the API's status and code", async () => {
  const client = ledger();
  const key = randomUUID();
  await client.record({ provider: "crm", account: account(), action: "create_task", args: { title: "One" } }, { idempotencyKey: key });
  await assert.rejects(
    client.record({ provider: "crm", account: account(), action: "create_task", args: { title: "Another" } }, { idempotencyKey: key }),
    (error) => error instanceof IdempotencyKeyReused && error.status === 409 && error.code === "idempotency_key_reused"
      && error.requestId === key && /idempotency/i.test(error.detail),
  );
  await assert.rejects(
    client.record({ provider: "crm", account: account(), action: "create_task", args: { title: 42 } }),
    (error) => error instanceof InvalidInput && error.status === 422 && error.code === "invalid_input",
  );
  await assert.rejects(
    new Ledger(env("OPLEDGER_BASE_URL"), { token: "not-a-token-0123456789" }).whoami(),
    (error) => error instanceof Unauthorized && error.status === 401 && error.code === "unauthorized",
  );
  await assert.rejects(
    client.status(randomUUID()),
    (error) => error instanceof NotFound && error.status === 404 && error.code === "not_found",
  );
  await assert.rejects(
    new Ledger("http://127.0.0.1:9", { token: "any-token-0123456789", sleep: async () => {} }).whoami(),
    (error) => error instanceof Unavailable && error instanceof LedgerError && error.code === "unreachable" && error.retryable,
  );
});

test("a 503 after the server recorded, or a lost answer, is repeated with the same key and finds the one operation", async () => {
  const proxy = await faultyProxy(env("OPLEDGER_BASE_URL"));
  try {
    const client = new Ledger(proxy.url, { token: env("OPLEDGER_TOKEN"), sleep: async () => {} });
    for (const fault of ["503_after", "drop_after"]) {
      proxy.keys.length = 0;
      proxy.faults.push(fault);
      const recorded = await client.record({ provider: "crm", account: account(), action: "create_task", args: { title: title(fault) } });
      assert.ok(recorded.replayed && recorded.created === false, `${fault}: ${JSON.stringify(recorded)}`);
      assert.equal(proxy.keys.length, 2, fault);
      assert.equal(proxy.keys[0], proxy.keys[1], fault);
    }
    // Bounded: one call and maxRetries repeats, then the last failure.
    const once = new Ledger(proxy.url, { token: env("OPLEDGER_TOKEN"), maxRetries: 1, sleep: async () => {} });
    proxy.keys.length = 0;
    proxy.faults.push("503_after", "503_after");
    await assert.rejects(
      once.record({ provider: "crm", account: account(), action: "create_task", args: { title: title("bounded") } }),
      (error) => error instanceof Unavailable && error.code === "outcome_unknown",
    );
    assert.equal(proxy.keys.length, 2);
  } finally {
    await proxy.close();
  }
});

test("waitFor answers the settled operation, and times out with where it stood", async () => {
  const client = ledger();
  const recorded = await client.record({ provider: "crm", account: account(), action: "create_task", args: { title: title("waited") } });
  await assert.rejects(
    client.waitFor(recorded.operation_id, { timeoutMs: 200 }),
    (error) => error instanceof WaitTimedOut && error.operation.state === "pending",
  );
  await client.execute(recorded.operation_id, { waitMs: 0 });
  const settled = await client.waitFor(recorded.operation_id, { timeoutMs: 30_000 });
  assert.ok(confirmed(settled), JSON.stringify(settled));
});

test("listings page through the operations and counts and whoami answer for the token", async () => {
  const client = ledger();
  for (let i = 0; i < 3; i += 1) {
    await client.record({ provider: "crm-plain", account: account(), action: "create_task", args: { title: title("Listed") } });
  }
  const first = await client.list({ provider: "crm-plain", state: "pending", limit: 2 });
  assert.equal(first.operations.length, 2);
  assert.notEqual(first.next, null);
  let all = 0;
  for await (const item of client.listAll({ provider: "crm-plain", state: "pending", limit: 1 })) {
    assert.equal(item.provider, "crm-plain");
    all += 1;
  }
  assert.ok(all >= 3, `${all}`);
  const counts = await client.counts();
  assert.ok((counts.by_state.pending ?? 0) >= 3, JSON.stringify(counts));
  const me = await client.whoami();
  assert.equal(me.kind, "tenant");
  const trace = await client.trace(first.operations[0].operation_id);
  assert.equal(trace.operation_id, first.operations[0].operation_id);
});

test("an approval covers the recorded snapshot and the operator's review decides an unknown one", async () => {
  const client = ledger();
  const waiting = await client.record({
    provider: "crm", account: account(), action: "create_task", args: { title: title("Approve") }, requires_approval: true,
  });
  assert.equal(waiting.state, "awaiting_approval");
  await assert.rejects(
    client.approve(waiting.operation_id, { approver: "manager", args_hash: `sha256:${"0".repeat(64)}` }),
    (error) => error instanceof LedgerError && error.status === 409,
  );
  const approved = await client.approve(waiting.operation_id, { approver: "manager", args_hash: waiting.args_hash });
  assert.equal(approved.state, "pending");

  const lost = title("Reviewed");
  await stand.dropNextResponse("plain");
  const unknown = await client.recordAndExecute(
    { provider: "crm-plain", account: account(), action: "create_task", args: { title: lost } }, { waitMs: 100 },
  );
  assert.ok(notConfirmed(unknown), unknown.state);
  const queue = await operator().reviewQueue({ limit: 1000 });
  assert.ok(Array.isArray(queue.queue));
  const settled = await untilSettled(client, unknown.operation_id);
  await assert.rejects(
    operator().review(settled.operation_id, { decision: "abandon", note: "settled already" }),
    (error) => error instanceof LedgerError && error.status === 409,
  );
});

test("the outcome feed resumes after the last event with Last-Event-ID", async () => {
  const client = ledger();
  const made = [];
  for (let i = 0; i < 2; i += 1) {
    made.push(await client.recordAndExecute(
      { provider: "crm", account: account(), action: "create_task", args: { title: title("Feed") } }, { waitMs: 5000 },
    ));
  }
  const controller = new AbortController();
  /** @type {import("../src/index.js").OutcomeEvent[]} */
  const seen = [];
  for await (const event of client.outcomes({ types: ["succeeded"], signal: controller.signal })) {
    seen.push(event);
    if (made.every((op) => seen.some((e) => e.operation_id === op.operation_id))) break;
  }
  const resumeAfter = seen.find((e) => e.operation_id === made[0].operation_id)?.position;
  assert.ok(resumeAfter !== undefined);
  const resumed = [];
  /** @type {string[]} */
  const lastEventIds = [];
  const watched = new Ledger(env("OPLEDGER_BASE_URL"), {
    token: env("OPLEDGER_TOKEN"),
    fetch: async (url, init) => {
      lastEventIds.push(new Headers(init?.headers).get("Last-Event-ID") ?? "");
      return fetch(url, init);
    },
  });
  for await (const event of watched.outcomes({ types: ["succeeded"], after: resumeAfter })) {
    resumed.push(event);
    if (event.operation_id === made[1].operation_id) break;
  }
  assert.deepEqual(lastEventIds, [String(resumeAfter)]);
  assert.ok(resumed.every((e) => e.position > resumeAfter));
  assert.ok(!resumed.some((e) => e.operation_id === made[0].operation_id));
});

test("a guarded tool answers not confirmed after a lost response and its retry finds the one task", async () => {
  const client = ledger();
  const task = title("Guarded");
  // A short wait: the answer comes while the send is unknown (or still in flight), before the
  // plain CRM's search (its lag is 200 ms) can show the object.
  const createTask = client.guardedTool({ provider: "crm-plain", account: account(), action: "create_task" }, { waitMs: 100 });
  await stand.dropNextResponse("plain");
  const first = await createTask.run({ title: task }, { requestId: "ts-call-1" });
  assertNotConfirmedSentence(first.text);
  const settled = await untilSettled(client, first.operation.operation_id);
  const retried = await createTask.run({ title: task }, { requestId: "ts-call-1" });
  assert.equal(retried.operation.operation_id, first.operation.operation_id);
  assert.equal(retried.operation.replayed, true);
  const objects = await stand.objectsTitled(task);
  assert.equal(objects.length, 1, JSON.stringify(objects));
  assert.equal(settled.external_id, objects[0].id);
  assertDoneSentence(retried.text, objects[0].id);
});
