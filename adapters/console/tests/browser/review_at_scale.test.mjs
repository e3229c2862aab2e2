// The console in an incident: a ledger with more operations waiting for a person than the API's
// largest page, in headless Chromium against a real `opledger serve`. tests/serve/console.rs
// seeds the ledger, starts the server, and runs this script with:
//   OPLEDGER_BASE_URL                        the server
//   OPLEDGER_OPERATOR_TOKEN                  an operator of every tenant
//   OPLEDGER_OPERATOR_AB_TOKEN               an operator of tenants A and B
//   OPLEDGER_WAITING                         how many operations were seeded waiting
//   OPLEDGER_NODE_MODULES, OPLEDGER_SCREENSHOTS
// Every step waits for what it expects (no sleeps); any failure exits non-zero with the step's
// name.

import { createRequire } from "node:module";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set; run this through tests/serve/console.rs`);
  return value;
};
const BASE = env("OPLEDGER_BASE_URL");
const OPERATOR = env("OPLEDGER_OPERATOR_TOKEN");
const OPERATOR_AB = env("OPLEDGER_OPERATOR_AB_TOKEN");
const WAITING = Number(env("OPLEDGER_WAITING"));
const MODULES = env("OPLEDGER_NODE_MODULES");
const SHOTS = env("OPLEDGER_SCREENSHOTS");
const WAIT_MS = 30000;
const LAPTOP = { width: 1280, height: 800 };
/// Items on one page of the console's queue (pages/review.js).
const QUEUE_ROWS = 50;

const require = createRequire(join(MODULES, "node_modules", "noop.js"));
const { chromium } = require("playwright-core");
const AXE = readFileSync(require.resolve("axe-core/axe.min.js"), "utf8");

async function api(path, token = OPERATOR, body = undefined) {
  const response = await fetch(`${BASE}${path}`, {
    method: body === undefined ? "GET" : "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, json: await response.json().catch(() => null) };
}

const profile = mkdtempSync(join(tmpdir(), "opledger-chromium-"));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  baseURL: BASE,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const problems = [];

async function newPage() {
  const page = await browser.newPage();
  await page.setViewportSize(LAPTOP);
  page.setDefaultTimeout(WAIT_MS);
  page.on("console", (message) => {
    if (message.type() === "error" && !/Failed to load resource: the server responded with a status of (401|403|404|409|422)/.test(message.text())) {
      problems.push(`console error: ${message.text()}`);
    }
  });
  page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  return page;
}

let step = "";
async function check(name, body) {
  step = name;
  const started = Date.now();
  await body();
  console.log(`ok - ${name} (${Date.now() - started} ms)`);
}

async function axe(page, name) {
  await page.evaluate(AXE);
  const results = await page.evaluate(() => window.axe.run(document, { resultTypes: ["violations"] }));
  const serious = results.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  assert.deepEqual(serious.map((v) => `${v.id}: ${v.help}`), [], `axe-core finds serious violations on ${name}`);
}

async function signIn(page, token) {
  await page.goto("/console");
  await page.getByLabel("Access token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#who:not([hidden])").waitFor();
}

/// The operation ids the queue page shows, in order, once it has loaded.
async function shownIds(page) {
  await page.locator(".queue[aria-busy=false]").waitFor();
  return page.locator(".queue-item").evaluateAll((nodes) => nodes.map((n) => n.dataset.operation));
}

try {
  const page = await newPage();

  await check("the navigation's count is the server's, not a page's length", async () => {
    await signIn(page, OPERATOR);
    await page.locator("#review-count", { hasText: String(WAITING) }).waitFor();
  });

  await check("the queue pages through every waiting item, newest first, to the last one", async () => {
    await page.goto("/console#/review");
    await page.locator(".queue-summary", { hasText: `${WAITING} waiting match` }).waitFor();
    const newest = (await api("/v1/review?order=newest&limit=1&detail=none")).json.queue[0].operation_id;
    const oldest = (await api("/v1/review?order=oldest&limit=1&detail=none")).json.queue[0].operation_id;
    const seen = [];
    let pages = 0;
    for (;;) {
      const ids = await shownIds(page);
      assert.ok(ids.length <= QUEUE_ROWS, `a page shows at most ${QUEUE_ROWS}`);
      seen.push(...ids);
      pages += 1;
      if (pages === 1) {
        assert.equal(ids[0], newest, "the newest first");
        await axe(page, "the review queue in an incident");
        await page.screenshot({ path: join(SHOTS, "review-queue-incident.png"), fullPage: false });
      }
      const next = page.getByRole("link", { name: "Next page →" });
      if (!(await next.count())) break;
      const before = page.url();
      await next.click();
      await page.waitForFunction((url) => location.href !== url, before);
    }
    assert.equal(seen.length, WAITING, `every item once across ${pages} pages`);
    assert.equal(new Set(seen).size, WAITING, "no item twice");
    assert.equal(seen.at(-1), oldest, "the last page ends with the longest-waiting item");
  });

  await check("a page of the queue transfers a bounded amount, whatever the queue's length", async () => {
    const loading = Date.now();
    await page.goto("/console#/review");
    await shownIds(page);
    const paint = await page.evaluate(() => performance.getEntriesByType("paint").find((entry) => entry.name === "first-contentful-paint")?.startTime);
    console.log(`  the review page with ${WAITING} waiting: first contentful paint ${Math.round(paint ?? -1)} ms, its page of items shown after ${Date.now() - loading} ms`);
    const bytes = await page.evaluate(() =>
      performance
        .getEntriesByType("resource")
        .filter((entry) => entry.name.includes("/v1/review?"))
        .map((entry) => entry.encodedBodySize)
        .at(-1),
    );
    console.log(`  the first page of ${WAITING} waiting: ${bytes} bytes of JSON`);
    assert.ok(bytes < 200_000, `one page is ${bytes} bytes`);
  });

  await check("the oldest-first toggle and the filters live in the URL, and nothing sticks", async () => {
    await page.getByRole("link", { name: "Show oldest first" }).click();
    await page.waitForFunction(() => location.hash.includes("order=oldest"));
    const oldest = (await api("/v1/review?order=oldest&limit=1&detail=none")).json.queue[0].operation_id;
    assert.equal((await shownIds(page))[0], oldest);
    const tenantB = (await api("/v1/review?tenant=tenant-b&limit=1&detail=none")).json.total;
    assert.ok(tenantB > 0 && tenantB < WAITING, `tenant B has ${tenantB}`);
    await page.getByLabel("Tenant").fill("tenant-b");
    await page.getByRole("button", { name: "Show" }).click();
    await page.locator(".queue-summary", { hasText: `${tenantB} waiting match` }).waitFor();
    assert.ok(page.url().includes("tenant=tenant-b") && page.url().includes("order=oldest"), page.url());
    // A shared link shows the same; the plain route shows everything again.
    await page.goto("/console#/review");
    await page.locator(".queue-summary", { hasText: `${WAITING} waiting match` }).waitFor();
    assert.equal(await page.getByLabel("Tenant").inputValue(), "");
  });

  await check("one item opens from its own route, without reading the queue", async () => {
    const deep = (await api("/v1/review?order=oldest&limit=1&detail=none")).json.queue[0].operation_id;
    const requested = [];
    page.on("request", (request) => requested.push(new URL(request.url()).pathname + new URL(request.url()).search));
    await page.goto(`/console#/review/${deep}`);
    await page.locator("#decide-heading").waitFor();
    assert.ok(requested.some((path) => path === `/v1/review/${deep}`), requested.join(" "));
    assert.ok(!requested.some((path) => path.startsWith("/v1/review?")), `no queue listing: ${requested.join(" ")}`);
  });

  await check("an operator of two tenants sees both counted, and a tenant only when the URL names it", async () => {
    const both = await newPage();
    await signIn(both, OPERATOR_AB);
    await both.getByRole("link", { name: "Overview" }).click();
    await both.locator(".stat-needs_review .stat-number", { hasText: String(WAITING) }).waitFor();
    await both.getByText("Counting every tenant this token sees.").waitFor();
    await both.getByLabel("Tenant", { exact: true }).fill("tenant-b");
    await both.getByRole("button", { name: "Count" }).click();
    const tenantB = (await api("/v1/counts?tenant=tenant-b")).json.by_state.needs_review;
    await both.locator(".stat-needs_review .stat-number", { hasText: new RegExp(`^${tenantB}$`) }).waitFor();
    await both.getByText("Counting tenant tenant-b only.").waitFor();
    await axe(both, "the overview of one tenant");
    // The choice is not kept: the overview's own link counts every tenant again.
    await both.getByRole("link", { name: "Overview" }).click();
    await both.locator(".stat-needs_review .stat-number", { hasText: String(WAITING) }).waitFor();
    await both.close();
  });

  await check("operations are found by their delivery id and action, newest first, from the URL", async () => {
    await page.goto("/console#/operations?tenant=tenant-a&source_id=incident-42");
    const rows = page.locator("table.listing tbody tr");
    await rows.first().waitFor();
    assert.equal(await rows.count(), 1, "one delivery, one operation");
    assert.equal(await page.getByLabel("Source id").inputValue(), "incident-42");
    await page.goto("/console#/operations?tenant=tenant-a&action=create_task");
    await rows.nth(1).waitFor();
    const newest = (await api("/v1/operations?tenant=tenant-a&action=create_task&order=newest&limit=1")).json.operations[0].operation_id;
    assert.equal(await rows.first().locator("a").getAttribute("title"), newest, "the newest first");
    await page.goto("/console#/operations?tenant=tenant-a&action=no_such_action");
    await page.getByText("No operation matches.").waitFor();
  });

  await check("a bulk abandon of 500 by a filter records 500 decisions, and one by ids lists those it could not take", async () => {
    const before = (await api("/v1/review?tenant=tenant-a&limit=1&detail=none")).json.total;
    const note = "the CRM was down from 02:00 to 02:40; the agents will ask again";
    const dry = await api("/v1/review/bulk", OPERATOR, { decision: "abandon", note, filter: { tenant: "tenant-a" }, limit: 500, dry_run: true });
    assert.equal(dry.status, 200, JSON.stringify(dry.json));
    assert.equal(dry.json.decided.length, 500, "the dry run says 500 would be abandoned");
    assert.equal((await api("/v1/review?tenant=tenant-a&limit=1&detail=none")).json.total, before, "a dry run writes nothing");
    const started = Date.now();
    const done = await api("/v1/review/bulk", OPERATOR, { decision: "abandon", note, filter: { tenant: "tenant-a" }, limit: 500 });
    assert.equal(done.status, 200, JSON.stringify(done.json).slice(0, 500));
    console.log(`  500 abandoned in ${Date.now() - started} ms`);
    assert.equal(done.json.decided.length, 500);
    assert.deepEqual(done.json.refused, []);
    assert.ok(done.json.decided.every((d) => d.state === "abandoned"), "each one abandoned");
    assert.deepEqual(done.json.decided.map((d) => d.operation_id), dry.json.decided.map((d) => d.operation_id), "the ones the dry run named");
    assert.equal((await api("/v1/review?tenant=tenant-a&limit=1&detail=none")).json.total, before - 500);
    // One decision event per operation, the note and the operator's name on each.
    for (const { operation_id } of done.json.decided.slice(0, 5)) {
      const events = (await api(`/v1/operations/${operation_id}/events`)).json.events;
      const resolved = events.filter((e) => e.type === "ReviewResolved");
      assert.equal(resolved.length, 1, JSON.stringify(events.map((e) => e.type)));
      assert.ok(JSON.stringify(resolved[0]).includes(note) && JSON.stringify(resolved[0]).includes("oncall"), JSON.stringify(resolved[0]));
    }
    // By ids: three already decided, two still waiting.
    const waiting = (await api("/v1/review?tenant=tenant-a&limit=2&detail=none")).json.queue.map((i) => i.operation_id);
    const gone = done.json.decided.slice(0, 3).map((d) => d.operation_id);
    const mixed = await api("/v1/review/bulk", OPERATOR, { decision: "abandon", note, operation_ids: [...gone, ...waiting] });
    assert.equal(mixed.status, 200, JSON.stringify(mixed.json));
    assert.deepEqual(mixed.json.decided.map((d) => d.operation_id), waiting);
    assert.deepEqual(mixed.json.refused.map((r) => [r.operation_id, r.code]), gone.map((id) => [id, "not_waiting"]));
    assert.ok(mixed.json.refused.every((r) => r.message.includes("abandoned")), JSON.stringify(mixed.json.refused));
  });

  await check("in the console, every item matching a filter is previewed, confirmed and decided, with the result shown", async () => {
    const tenantB = (await api("/v1/review?tenant=tenant-b&limit=1&detail=none")).json.total;
    await page.goto("/console#/review?tenant=tenant-b");
    await page.locator(".queue-summary", { hasText: `${tenantB} waiting match` }).waitFor();
    await page.getByText("Decide many at once").click();
    await page.getByLabel("Decision", { exact: true }).selectOption("abandon");
    await page.getByLabel("Why (recorded with each decision)").fill("tenant B's CRM was down; they will ask again");
    await page.getByRole("button", { name: "Preview" }).click();
    await page.getByText(`${tenantB} would take the decision; 0 could not.`).waitFor();
    assert.equal((await api("/v1/review?tenant=tenant-b&limit=1&detail=none")).json.total, tenantB, "the preview wrote nothing");
    await axe(page, "a bulk decision's preview");
    await page.screenshot({ path: join(SHOTS, "review-bulk.png"), fullPage: false });
    await page.getByRole("button", { name: `Give up on ${tenantB} operations` }).click();
    await page.getByText(`Decided: ${tenantB}. Could not take it: 0.`).waitFor();
    assert.equal((await api("/v1/review?tenant=tenant-b&limit=1&detail=none")).json.total, 0);
  });

  await check("two operators in two browser contexts claim one case: the second is told who holds it and cannot decide it", async () => {
    const id = (await api("/v1/review?tenant=tenant-a&limit=1&detail=none")).json.queue[0].operation_id;
    await page.goto(`/console#/review/${id}`);
    await page.getByRole("button", { name: "Claim this case" }).click();
    await page.getByText("You hold this case until").waitFor();
    assert.match(await page.locator("#who-role").innerText(), /oncall \(operator, every tenant\)/);
    const other = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true, args: ["--headless", "--no-sandbox", "--disable-gpu"] });
    try {
      const context = await other.newContext({ baseURL: BASE, viewport: LAPTOP });
      const second = await context.newPage();
      second.setDefaultTimeout(WAIT_MS);
      await signIn(second, OPERATOR_AB);
      await second.goto(`/console#/review/${id}`);
      await second.getByText("oncall is working this case until").waitFor();
      assert.equal(await second.getByRole("button", { name: "Claim this case" }).count(), 0, "no claim over someone else's");
      await second.getByLabel("Give up — do not send it").check();
      await second.getByLabel("Why (recorded with your decision)").fill("looks like the outage");
      await second.getByRole("button", { name: "Record decision" }).click();
      await second.getByRole("alert").filter({ hasText: "claimed by oncall" }).waitFor();
      await axe(second, "a case claimed by someone else");
      await second.screenshot({ path: join(SHOTS, "decide-claimed.png"), fullPage: false });
      const bulk = await api("/v1/review/bulk", OPERATOR_AB, { decision: "abandon", note: "outage", operation_ids: [id] });
      assert.deepEqual(bulk.json.refused.map((r) => r.code), ["claimed"], JSON.stringify(bulk.json));
      assert.equal((await api(`/v1/review/${id}`)).json.claim.holder, "oncall");
      // Let go: the other operator may now claim it.
      await page.getByRole("button", { name: "Let go of it" }).click();
      await page.getByText("Nobody is working this case.").waitFor();
      await second.reload();
      await second.getByRole("button", { name: "Claim this case" }).click();
      await second.getByText("You hold this case until").waitFor();
      await context.close();
    } finally {
      await other.close();
    }
  });

  await check("times show milliseconds, and an operator opening Approvals is told who can approve instead of buttons that fail", async () => {
    const id = (await api("/v1/review?limit=1&detail=none")).json.queue[0].operation_id;
    await page.goto(`/console#/review/${id}`);
    const started = await page.locator("td[data-label=Started]").first().innerText();
    assert.match(started, /\d\d:\d\d:\d\d\.\d{3} UTC/, started);
    await page.goto("/console#/approvals");
    await page.getByText("an operator token cannot approve or deny").waitFor();
    assert.equal(await page.getByRole("button", { name: /Approve/ }).count(), 0);
  });

  assert.deepEqual(problems, [], "the browser reported problems");
  console.log("all scale checks passed");
} catch (error) {
  console.error(`FAILED at: ${step}\n${error.stack ?? error}`);
  if (problems.length) console.error(`browser problems:\n${problems.join("\n")}`);
  process.exitCode = 1;
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
