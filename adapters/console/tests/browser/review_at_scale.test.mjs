// The console in an incident: a ledger with more operations waiting for a person than the API's
// largest page, in headless Chromium against a real `opledger serve`. tests/serve/console.rs
// seeds the ledger, starts the server, and runs this script with:
//   OPLEDGER_BASE_URL                        the server
//   OPLEDGER_OPERATOR_TOKEN                  an operator of every tenant
//   OPLEDGER_OPERATOR_AB_TOKEN               an operator of tenants A and B
//   OPLEDGER_WAITING                         how many operations were seeded waiting
//   OPLEDGER_SETTLED                         how many settled operations were seeded before them
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
const SETTLED = Number(process.env.OPLEDGER_SETTLED ?? "0");
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

/// An RFC 3339 UTC time as text that sorts as the time does: the API writes 3, 6 or 9 digits of
/// fractional seconds (as many as the value needs), so "…00.5Z" and "…00.123456Z" must be
/// padded to nanoseconds before they are compared.
function instant(text) {
  const [whole, fraction = ""] = text.replace(/Z$/, "").split(".");
  return `${whole}.${fraction.padEnd(9, "0")}`;
}

/// Follows the queue's "Next page →" link from the page showing `ids`, if there is one, and waits
/// until the next page is shown: the URL changing is not enough, because the queue can still say
/// it is not busy, with the previous page's items, before the next page's request starts.
async function nextPage(page, ids) {
  const next = page.getByRole("link", { name: "Next page →" });
  if (!(await next.count())) return false;
  const before = page.url();
  await next.click();
  await page.waitForFunction((url) => location.href !== url, before);
  await page.waitForFunction(
    (first) => {
      const item = document.querySelector(".queue[aria-busy=false] .queue-item");
      return item !== null && item.dataset.operation !== first;
    },
    ids[0],
  );
  return true;
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
      if (!(await nextPage(page, ids))) break;
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

  await check("the console's first load and the review page's are measured: bytes, first paint, interactive", async () => {
    // A fresh tab each, so its resource timings are its own load's.
    for (const [what, route, ready] of [
      ["overview", "/console#/overview", ".stat-needs_review .stat-number"],
      ["review queue", "/console#/review", ".queue[aria-busy=false]"],
    ]) {
      const tab = await newPage();
      await signIn(tab, OPERATOR);
      await tab.goto("about:blank");
      const started = Date.now();
      await tab.goto(route);
      await tab.locator(ready).first().waitFor();
      const shownAfter = Date.now() - started;
      const timing = await tab.evaluate(() => {
        const navigation = performance.getEntriesByType("navigation")[0];
        const paint = performance.getEntriesByType("paint").find((entry) => entry.name === "first-contentful-paint");
        const resources = performance.getEntriesByType("resource");
        return {
          paint: paint?.startTime ?? -1,
          interactive: navigation?.domInteractive ?? -1,
          bytes: resources.reduce((sum, entry) => sum + entry.transferSize, navigation?.transferSize ?? 0),
          requests: resources.length + 1,
        };
      });
      console.log(
        `  bench=console-load page=${what.replace(" ", "-")} waiting=${WAITING} settled=${SETTLED} first_paint_ms=${Math.round(timing.paint)} dom_interactive_ms=${Math.round(timing.interactive)} data_shown_ms=${shownAfter} bytes=${timing.bytes} requests=${timing.requests}`,
      );
      await tab.close();
    }
    // Search latency through the API at this ledger's size: the first page of a search by title
    // (and by owner) among the settled operations, and of the queue.
    const timed = async (path) => {
      const took = [];
      for (let n = 0; n < 20; n++) {
        const started = performance.now();
        const answer = await api(path(n));
        took.push(performance.now() - started);
        assert.equal(answer.status, 200, JSON.stringify(answer.json));
      }
      took.sort((a, b) => a - b);
      return `p50_ms=${took[10].toFixed(1)} max_ms=${took[19].toFixed(1)}`;
    };
    const total = SETTLED + WAITING;
    if (SETTLED > 0) {
      console.log(`  bench=search what=operations-title operations=${total} ${await timed((n) => `/v1/operations?tenant=tenant-a&arg=${encodeURIComponent(`title:Settled task ${(n * 7919) % SETTLED}`)}`)}`);
      console.log(`  bench=search what=operations-owner-page operations=${total} ${await timed((n) => `/v1/operations?tenant=tenant-a&order=newest&owner=owner-${n % 50}`)}`);
    }
    console.log(`  bench=search what=review-title operations=${total} ${await timed((n) => `/v1/review?detail=none&arg=${encodeURIComponent(`title:Incident task ${(n * 7919) % WAITING}`)}`)}`);
    console.log(`  bench=search what=review-owner-page operations=${total} ${await timed((n) => `/v1/review?detail=none&order=newest&owner=owner-${n % 7}`)}`);
  });

  await check("the oldest-first toggle and the filters live in the URL, and nothing sticks", async () => {
    await page.getByRole("link", { name: "Show oldest first" }).click();
    await page.waitForFunction(() => location.hash.includes("order=oldest"));
    const oldest = (await api("/v1/review?order=oldest&limit=1&detail=none")).json.queue[0].operation_id;
    assert.equal((await shownIds(page))[0], oldest);
    const tenantB = (await api("/v1/review?tenant=tenant-b&limit=1&detail=none")).json.total;
    assert.ok(tenantB > 0 && tenantB < WAITING, `tenant B has ${tenantB}`);
    await page.getByLabel("Tenant", { exact: true }).fill("tenant-b");
    await page.getByRole("button", { name: "Show" }).click();
    await page.locator(".queue-summary", { hasText: `${tenantB} waiting match` }).waitFor();
    assert.ok(page.url().includes("tenant=tenant-b") && page.url().includes("order=oldest"), page.url());
    // A shared link shows the same; the plain route shows everything again.
    await page.goto("/console#/review");
    await page.locator(".queue-summary", { hasText: `${WAITING} waiting match` }).waitFor();
    assert.equal(await page.getByLabel("Tenant", { exact: true }).inputValue(), "");
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

  await check("the queue is searched by title, owner and time from the URL, with its count and paging intact", async () => {
    // By title, typed in the form in another case and spacing than recorded.
    await page.goto("/console#/review");
    await page.locator(".queue-summary", { hasText: `${WAITING} waiting match` }).waitFor();
    await page.getByLabel("Title or argument").fill("title:incident  TASK 77");
    await page.getByRole("button", { name: "Show" }).click();
    await page.locator(".queue-summary", { hasText: "1 waiting matches" }).waitFor();
    assert.ok(page.url().includes("arg=title"), page.url());
    const wanted = (await api(`/v1/review?arg=${encodeURIComponent("title:Incident task 77")}&detail=none`)).json.queue.map((i) => i.operation_id);
    assert.deepEqual(await shownIds(page), wanted);
    // By owner: every one of the owner's items once, page after page.
    const owner = (await api("/v1/review?owner=owner-3&limit=1&detail=none")).json.total;
    assert.ok(owner > QUEUE_ROWS && owner < WAITING, `owner-3 has ${owner}`);
    await page.goto("/console#/review?owner=owner-3");
    await page.locator(".queue-summary", { hasText: `${owner} waiting match` }).waitFor();
    const seen = [];
    for (;;) {
      const ids = await shownIds(page);
      seen.push(...ids);
      if (!(await nextPage(page, ids))) break;
    }
    assert.equal(new Set(seen).size, owner, "every item of the owner's once");
    // A time range on when each became unresolved: the console counts what the API counts.
    const ten = (await api("/v1/review?order=oldest&limit=10&detail=none")).json.queue;
    const range = `since=${encodeURIComponent(ten[2].since)}&until=${encodeURIComponent(ten[8].since)}`;
    const inRange = (await api(`/v1/review?${range}&limit=1000&detail=none`)).json;
    assert.ok(inRange.total >= 1 && inRange.total <= 6, `${inRange.total} in the range`);
    assert.ok(inRange.queue.every((i) => instant(i.since) >= instant(ten[2].since) && instant(i.since) < instant(ten[8].since)), JSON.stringify(inRange.queue.map((i) => i.since)));
    await page.goto(`/console#/review?${range}`);
    await page.locator(".queue-summary", { hasText: `${inRange.total} waiting match` }).waitFor();
    await axe(page, "the review queue searched");
  });

  await check("columns chosen by the operator are kept in the URL, shared by it, and never stick", async () => {
    await page.goto("/console#/review?owner=owner-2");
    await page.locator(".queue[aria-busy=false]").waitFor();
    await page.getByText("Columns", { exact: true }).click();
    await page.getByLabel("Argument column").fill("title");
    await page.getByLabel("Owner column").check();
    await page.getByLabel("Tenant column").check();
    await page.getByRole("button", { name: "Apply columns" }).click();
    await page.waitForFunction(() => location.hash.includes("cols="));
    const url = page.url();
    assert.ok(decodeURIComponent(url).includes("cols=arg:title,owner,tenant") && url.includes("owner=owner-2"), url);
    const headings = async (p) => {
      await p.locator(".queue[aria-busy=false] table.queue-table").waitFor();
      return p.locator("table.queue-table thead th").allInnerTexts();
    };
    assert.deepEqual(await headings(page), ["Pick", "State", "Operation", "title", "Owner", "Tenant", "Claim"]);
    const first = page.locator("table.queue-table tbody tr").first();
    assert.match(await first.locator("td[data-label=title]").innerText(), /^Incident task \d+$/);
    assert.equal(await first.locator("td[data-label=Owner]").innerText(), "owner-2");
    await axe(page, "the review queue with chosen columns");
    await page.screenshot({ path: join(SHOTS, "review-columns.png"), fullPage: false });
    // The link, opened by another person in another tab, shows the same columns.
    const other = await newPage();
    await signIn(other, OPERATOR);
    await other.goto(url);
    assert.deepEqual(await headings(other), ["Pick", "State", "Operation", "title", "Owner", "Tenant", "Claim"]);
    // The queue's own link shows the cards again: nothing was remembered.
    await other.goto("/console#/review");
    await other.locator(".queue[aria-busy=false] article.queue-item").first().waitFor();
    assert.equal(await other.locator("table.queue-table").count(), 0);
    // The operations listing takes its columns the same way.
    await other.goto("/console#/operations?tenant=tenant-a&owner=owner-4&cols=arg:title,owner,attempts");
    await other.locator("table.listing tbody tr").first().waitFor();
    assert.deepEqual(await other.locator("table.listing thead th").allInnerTexts(), ["State", "Operation", "title", "Owner", "Attempts"]);
    const row = other.locator("table.listing tbody tr").first();
    assert.match(await row.locator("td[data-label=title]").innerText(), /^Incident task \d+$/);
    assert.equal(await row.locator("td[data-label=Owner]").innerText(), "owner-4");
    await axe(other, "operations with chosen columns");
    await other.close();
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
