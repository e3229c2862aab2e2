// The operator console end to end, in headless Chromium (Debian's, driven by playwright-core)
// against a real `opledger serve` and the CRM stand. tests/serve/console.rs starts both, installs
// this folder's packages with `npm ci`, and runs this script with:
//   OPLEDGER_BASE_URL, OPLEDGER_STAND_URL   the server and the stand
//   OPLEDGER_OPERATOR_TOKEN, OPLEDGER_OPERATOR_B_TOKEN, OPLEDGER_OPERATOR_AB_TOKEN,
//   OPLEDGER_TENANT_A_TOKEN,
//   OPLEDGER_TENANT_B_TOKEN, OPLEDGER_APPROVER_B_TOKEN, OPLEDGER_ACCOUNT,
//   OPLEDGER_ACCOUNT_TOKEN                  the account's token at the stand (for a copy made outside the ledger)
//   OPLEDGER_SEARCH_LAG_MS                  how long the stand's search takes to show a new task
//   OPLEDGER_NODE_MODULES                   where `npm ci` put the packages
//   OPLEDGER_SCREENSHOTS                    where the screenshots go (docs/console)
// Every step waits for what it expects (no sleeps); any failure exits non-zero with the step's
// name, and nothing is skipped.

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
const STAND = env("OPLEDGER_STAND_URL");
const OPERATOR = env("OPLEDGER_OPERATOR_TOKEN");
const OPERATOR_B = env("OPLEDGER_OPERATOR_B_TOKEN");
const OPERATOR_AB = env("OPLEDGER_OPERATOR_AB_TOKEN");
const TENANT_A = env("OPLEDGER_TENANT_A_TOKEN");
const TENANT_B = env("OPLEDGER_TENANT_B_TOKEN");
const APPROVER_B = env("OPLEDGER_APPROVER_B_TOKEN");
const ACCOUNT = env("OPLEDGER_ACCOUNT");
const ACCOUNT_TOKEN = env("OPLEDGER_ACCOUNT_TOKEN");
const SEARCH_LAG_MS = Number(env("OPLEDGER_SEARCH_LAG_MS"));
const MODULES = env("OPLEDGER_NODE_MODULES");
const SHOTS = env("OPLEDGER_SCREENSHOTS");
/// How long any one expectation waits before the test fails, in milliseconds.
const WAIT_MS = 30000;
const LAPTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };

const require = createRequire(join(MODULES, "node_modules", "noop.js"));
const { chromium } = require("playwright-core");
const AXE = readFileSync(require.resolve("axe-core/axe.min.js"), "utf8");

// ---- the API, as a client and the stand's fault switch ----

async function api(method, path, token, body) {
  const response = await fetch(`${BASE}${path}`, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await response.json().catch(() => null);
  return { status: response.status, json };
}

async function loseNextCreates(times) {
  const response = await fetch(`${STAND}/admin/faults`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ shape: "plain", method: "POST", kind: "drop_request", times }),
  });
  assert.ok(response.ok, `the stand takes the fault (${response.status})`);
}

/// Moves the stand's clock, which is what its search lag is measured on.
async function advanceStandClock(ms) {
  const response = await fetch(`${STAND}/admin/clock/advance`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ms }),
  });
  assert.ok(response.ok, `the stand clock moves (${response.status})`);
}

/// Polls `probe` (an API read, not the page) until it returns something, for at most WAIT_MS.
async function waitFor(probe, what) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const found = await probe();
    if (found) return found;
    assert.ok(Date.now() < deadline, `${what} within ${WAIT_MS} ms`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/// Records and executes a task at the lookup-only CRM whose request the stand loses: the
/// operation becomes unknown, then needs review once the lookups prove nothing.
async function lostTask(title) {
  const recorded = await api("POST", "/v1/operations?execute=true&wait_ms=200", TENANT_A, {
    provider: "crm-plain",
    account: ACCOUNT,
    action: "create_task",
    args: { title },
  });
  assert.ok([200, 201].includes(recorded.status), JSON.stringify(recorded.json));
  return recorded.json.operation_id;
}

async function stateOf(id) {
  return (await api("GET", `/v1/operations/${id}`, TENANT_A)).json;
}

async function standObjects() {
  const response = await fetch(`${STAND}/admin/objects`);
  return (await response.json()).objects;
}

// ---- the browser ----

const profile = mkdtempSync(join(tmpdir(), "opledger-chromium-"));
// One fresh profile; each page is its own tab, so each has its own sessionStorage (its own
// signed-in person).
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  baseURL: BASE,
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const problems = [];
/// The policy's refusals of inline scripts the browser reported: exactly one is expected, the
/// script the first step injects on purpose; any other is a console page needing one.
const inlineRefusals = [];

async function newPage(viewport) {
  const page = await browser.newPage();
  await page.setViewportSize(viewport);
  page.setDefaultTimeout(WAIT_MS);
  page.on("console", (message) => {
    if (/inline script/.test(message.text())) {
      inlineRefusals.push(message.text());
      return;
    }
    if (message.type() === "error" && !/Failed to load resource: the server responded with a status of (401|403|404|409|422)/.test(message.text())) {
      problems.push(`console error: ${message.text()}`);
    }
  });
  page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  page.on("request", (request) => {
    const url = new URL(request.url());
    if (url.origin !== new URL(BASE).origin) problems.push(`a request to another origin: ${url}`);
    if (/token/i.test(url.search) || url.search.includes(OPERATOR)) problems.push(`a secret in a URL: ${url}`);
  });
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
  assert.deepEqual(
    serious.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(" ")).join(", ")})`),
    [],
    `axe-core finds serious violations on ${name}`,
  );
}

async function shot(page, name) {
  // What a page shows a person never holds a programming value's name (raw JSON aside).
  // Text node by text node: textContent would glue "731" and "null" into one word.
  const leaked = await page.evaluate(() => {
    const walker = document.createTreeWalker(document.querySelector("main"), NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (node.parentElement.closest("pre")) continue;
      const found = /\bnull\b|\bundefined\b|\[object Object\]|\bNaN\b/.exec(node.data);
      if (found) return found[0];
    }
    return null;
  });
  assert.equal(leaked, null, `${name} shows “${leaked}” to a person`);
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true, animations: "disabled" });
}

async function signIn(page, token) {
  await page.goto("/console");
  await page.getByLabel("Access token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#who:not([hidden])").waitFor();
  await page.locator("#live[data-state=live]").waitFor();
}

async function noSidewaysScroll(page, name) {
  const [scroll, width, wide] = await page.evaluate(() => [
    document.documentElement.scrollWidth,
    window.innerWidth,
    [...document.querySelectorAll("body *")]
      .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5)
      .slice(0, 5)
      .map((e) => `${e.tagName.toLowerCase()}.${e.className} (right edge ${e.getBoundingClientRect().right})`),
  ]);
  assert.ok(scroll <= width, `${name} scrolls sideways at ${width} px (content ${scroll} px wide): ${wide.join("; ")}`);
}

try {
  const page = await newPage(LAPTOP);
  let first;
  let second;
  let watcher;

  await check("the console is served with a policy that forbids inline scripts and other origins", async () => {
    const response = await page.goto("/console");
    const policy = response.headers()["content-security-policy"];
    assert.match(policy, /script-src 'self'(;|$)/);
    assert.match(policy, /default-src 'none'/);
    assert.match(policy, /connect-src 'self'/);
    assert.equal(response.headers()["set-cookie"], undefined, "no cookie");
    await page.getByLabel("Access token").waitFor();
    assert.equal(await page.getByRole("button", { name: "Sign out" }).isVisible(), false, "nothing to sign out of yet");
    assert.equal(await page.locator("#nav").isVisible(), false, "no pages before signing in");
    // The browser enforces it: a script injected into the page does not run.
    const refused = await page.evaluate(
      () =>
        new Promise((resolve) => {
          document.addEventListener("securitypolicyviolation", (event) => resolve(event.effectiveDirective), { once: true });
          const script = document.createElement("script");
          script.textContent = "window.injected = true";
          document.body.append(script);
        }),
    );
    assert.equal(refused, "script-src-elem");
    assert.equal(await page.evaluate(() => window.injected), undefined, "the injected script did not run");
    await axe(page, "sign-in");
    await shot(page, "sign-in");
  });

  await check("a token the server does not know is refused with what to do", async () => {
    await page.getByLabel("Access token").fill("not-a-token-of-this-server");
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("alert").filter({ hasText: "not known to this server" }).waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.length), 0, "a refused token is not kept");
  });

  await check("an operator signs in and the token stays in the tab's session storage only", async () => {
    await signIn(page, OPERATOR);
    await page.locator("h1", { hasText: "Review queue" }).waitFor();
    const stored = await page.evaluate(() => Object.values(sessionStorage));
    assert.ok(stored.includes(OPERATOR));
    assert.equal(await page.evaluate(() => document.cookie), "");
  });

  await check("an empty ledger's overview says the log is empty, not a null head", async () => {
    await page.getByRole("link", { name: "Overview" }).click();
    await page.getByText(/the log is empty/).waitFor();
    assert.ok(!(await page.locator("main").innerText()).includes("null"), "no null is shown");
  });

  await check("an unknown operation appears live on the overview", async () => {
    await page.getByRole("link", { name: "Overview" }).click();
    await page.locator("h1", { hasText: "Overview" }).waitFor();
    await page.locator(".stat-needs_review .stat-number", { hasText: /^\d+$/ }).waitFor();
    // Layout shifts (the browser's own measure, as in Cumulative Layout Shift) while the live
    // events and the refreshed numbers arrive.
    await page.evaluate(() => {
      window.shifted = [];
      new PerformanceObserver((list) => {
        for (const entry of list.getEntries()) if (!entry.hadRecentInput) window.shifted.push(entry.value);
      }).observe({ type: "layout-shift" });
    });
    await loseNextCreates(2);
    first = await lostTask("Call Anna about the renewal");
    second = await lostTask("Call Boris about the invoice");
    await page.locator(`.recent a[href="#/operation/${first}"]`).first().waitFor();
    await page.locator(".recent .badge", { hasText: "needs review" }).first().waitFor();
    await page.locator(".stat-needs_review .stat-number", { hasText: "2" }).waitFor();
    const shifted = await page.evaluate(() => window.shifted);
    assert.deepEqual(shifted, [], "nothing on the overview moves while live updates arrive");
    await axe(page, "overview");
    await shot(page, "overview");
  });

  await check("the review queue lists both, newest first, oldest first on request, and opens the full evidence", async () => {
    await page.getByRole("link", { name: /Review queue/ }).click();
    const items = page.locator(".queue-item");
    await items.nth(1).waitFor();
    assert.deepEqual(await items.evaluateAll((nodes) => nodes.map((n) => n.dataset.operation)), [second, first]);
    await page.getByRole("link", { name: "Show oldest first" }).click();
    await page.waitForFunction(() => location.hash === "#/review?order=oldest");
    // The list is drawn again after the hash changes: wait for the new order to be drawn (the
    // queue is not busy yet in the moment between the two, so that alone is no sign).
    await page.waitForFunction((oldest) => document.querySelector(".queue-item")?.dataset.operation === oldest, first);
    await page.locator(".queue[aria-busy=false]").waitFor();
    await items.nth(1).waitFor();
    assert.deepEqual(await items.evaluateAll((nodes) => nodes.map((n) => n.dataset.operation)), [first, second]);
    await axe(page, "review queue");
    await shot(page, "review-queue");
    await page.getByRole("link", { name: /Call Anna about the renewal/ }).click();
    await page.locator("#decide-heading").waitFor();
    const evidence = await page.locator("main").innerText();
    for (const expected of ["Call Anna about the renewal", "crm-plain", ACCOUNT, "tenant-a", "Attempts (1)", "unknown", "Lookups (", "no safe retry", "cannot tell a repeated request from a new one", "proves nothing", "look for “Call Anna about the renewal” created around"]) {
      assert.ok(evidence.includes(expected), `the evidence shows “${expected}”`);
    }
    await axe(page, "decision form");
    await shot(page, "decide");
  });


  await check("a decision on a version that moved on is refused and shown as stale", async () => {
    // Another operator decides first, through the API, while this page shows the old version.
    const current = await stateOf(first);
    const other = await api("POST", `/v1/operations/${first}/review`, OPERATOR, {
      decision: "confirm",
      external_id: "found-by-hand-1",
      note: "found it in the CRM",
      expected_version: current.version,
    });
    assert.equal(other.status, 200, JSON.stringify(other.json));
    await page.getByLabel("Give up — do not send it").check();
    await page.getByLabel("Why (recorded with your decision)").fill("the client cancelled");
    await page.getByRole("button", { name: "Record decision" }).click();
    await page.locator(".stale", { hasText: "changed after you opened it" }).waitFor();
    // The refusal names who decided and what, not only that something changed.
    await page.locator(".stale", { hasText: /oncall decided that it succeeded as found-by-hand-1 at .*found it in the CRM/ }).waitFor();
    assert.equal((await stateOf(first)).state, "succeeded", "the stale decision changed nothing");
    await shot(page, "decide-stale");
    await page.getByRole("button", { name: "Reload the evidence" }).click();
    await page.getByText("does not wait for a decision").waitFor();
  });

  await check("a retry at a lookup-only CRM demands the duplicate-risk acknowledgement, explained", async () => {
    await page.goto(`/console#/review/${second}`);
    await page.locator("#decide-heading").waitFor();
    await page.getByLabel("It does not exist — send it again").check();
    // Asked as soon as the retry is chosen, before anything is submitted.
    await page.locator(".warning", { hasText: "a retry here may create a duplicate" }).waitFor();
    assert.equal(await page.getByLabel(/I checked the CRM/).isChecked(), false);
    await page.getByLabel("Why (recorded with your decision)").fill("the CRM's log shows it never arrived");
    // Submitted without the acknowledgement: the server refuses, and the console says so.
    await page.getByRole("button", { name: "Record decision" }).click();
    await page.getByRole("alert").filter({ hasText: "Nothing was sent: a retry here may create a duplicate" }).waitFor();
    assert.ok((await page.locator(".warning").innerText()).includes("choose “It exists”"), "the way out is named");
    assert.equal((await stateOf(second)).state, "needs_review", "nothing was decided");
    assert.equal((await standObjects()).length, 0, "nothing was sent");
    await axe(page, "duplicate-risk acknowledgement");
    await shot(page, "decide-duplicate-risk");
    // A second person watches the operation's timeline in another tab while this one decides.
    watcher = await newPage(LAPTOP);
    await signIn(watcher, OPERATOR);
    await watcher.goto(`/console#/operation/${second}`);
    await watcher.locator("li[data-type=ReviewRequired]").waitFor();
    await watcher.evaluate(() => {
      window.stillThisPage = true;
    });
    await page.getByLabel(/I checked the CRM/).check();
    await page.getByRole("button", { name: "Record decision" }).click();
    await page.locator(".done", { hasText: "Decision recorded" }).waitFor();
  });

  await check("the timeline gains the decision and then the outcome, live", async () => {
    await watcher.locator("li[data-type=ReviewResolved]").waitFor();
    await watcher.locator("li[data-type=AttemptSucceeded]").waitFor();
    assert.equal(await watcher.evaluate(() => window.stillThisPage), true, "the watcher's page was not reloaded");
    const versions = await watcher.locator(".timeline li .event-title .muted").allInnerTexts();
    assert.equal(new Set(versions).size, versions.length, `each event once: ${versions.join()}`);
    const types = await watcher.locator(".timeline li").evaluateAll((nodes) => nodes.map((n) => n.dataset.type));
    assert.equal(types[0], "IntentRecorded");
    assert.ok(types.indexOf("ReviewResolved") < types.lastIndexOf("AttemptSucceeded"), types.join());
    await watcher.close();
    await page.locator(".done .badge").waitFor();
    assert.equal(await page.locator("#moved-on").isHidden(), true, "the decision's own events are not news to reload for");
    await page.getByRole("link", { name: "See it in the timeline" }).click();
    await page.locator("li[data-type=AttemptSucceeded]").waitFor();
    assert.equal((await standObjects()).length, 1, "the retry sent once");
    await page.locator(".timeline li").first().getByText("Raw JSON").click();
    await page.locator(".timeline li pre").first().waitFor();
    await axe(page, "timeline");
    await shot(page, "timeline");
  });

  await check("trace search by the CRM's object id draws the chain to the decision", async () => {
    const external = (await stateOf(second)).external_id;
    await page.getByRole("link", { name: "Trace" }).click();
    await page.getByLabel("Any id").fill(external);
    await page.getByRole("button", { name: "Trace" }).click();
    await page.locator(".chain .node-outcome").waitFor();
    const labels = await page.locator(".chain .node-label").allInnerTexts();
    // In the order it happened: the lost attempt, the lookups that proved nothing, the person's
    // retry (with the risk they accepted), the attempt that succeeded.
    assert.deepEqual(labels.map((l) => l.replace(" (your id)", "")), ["Source delivery", "Operation", "Attempt #1", `Lookups (${labels[3]?.match(/\d+/)?.[0]})`, "A person decided", "Attempt #2", "Outcome"]);
    await page.locator(".chain .node-decision", { hasText: "oncall (with the operator token oncall): retry · accepted the duplicate risk" }).waitFor();
    await page.locator(".chain .matched", { hasText: external }).waitFor();
    await axe(page, "trace");
    await shot(page, "trace");
  });

  await check("trace search by a duplicate object's id flags the second object for one request", async () => {
    // Two copies a retry outside the ledger made, both visible to the CRM's search by the time
    // opledger's own request is lost: its lookup finds two tasks with the operation's label.
    const recorded = await api("POST", "/v1/operations", TENANT_A, {
      provider: "crm-plain",
      account: ACCOUNT,
      action: "create_task",
      args: { title: "Book the venue" },
      requires_approval: true,
    });
    assert.equal(recorded.status, 201, JSON.stringify(recorded.json));
    const id = recorded.json.operation_id;
    for (const _ of [1, 2]) {
      const copy = await fetch(`${STAND}/plain/${ACCOUNT}/tasks`, {
        method: "POST",
        headers: { Authorization: `Bearer ${ACCOUNT_TOKEN}`, "Content-Type": "application/json" },
        body: JSON.stringify({ title: "Book the venue", opledger_label: `opl-${id}` }),
      });
      assert.ok(copy.ok, `the stand creates a copy (${copy.status})`);
    }
    await advanceStandClock(SEARCH_LAG_MS + 1);
    await loseNextCreates(1);
    const approved = await api("POST", `/v1/operations/${id}/approve`, TENANT_A, { approver: "Erin from sales", args_hash: recorded.json.args_hash });
    assert.equal(approved.status, 200, JSON.stringify(approved.json));
    const settled = await waitFor(async () => {
      const state = await stateOf(id);
      return state.state === "succeeded" ? state : null;
    }, `${id} settles`);
    const labelled = (await standObjects()).filter((o) => o.label === `opl-${id}`);
    assert.equal(labelled.length, 2, JSON.stringify(labelled));
    const duplicate = labelled.map((o) => o.id).find((objectId) => objectId !== settled.external_id);
    assert.ok(duplicate, `one of ${JSON.stringify(labelled)} is not the confirmed ${settled.external_id}`);
    // An id is found through the read models, which the API waits for only 2 s; in a loaded CI
    // run (90 serve tests beside this browser) they once fell further behind, the search
    // answered 404 and the page had nothing to flag. What is tested here is the page, so wait
    // until the API knows the id.
    await waitFor(async () => (await api("GET", `/v1/trace/${duplicate}`, TENANT_A)).status === 200, `the read models know ${duplicate}`);
    await page.getByRole("link", { name: "Trace" }).click();
    // The page is already a trace (the check before), so the old form stays in the DOM until the
    // hash change is handled: filling it, then clicking the new form's button, submitted an
    // empty search (the input is `required`), and the page showed no result — 2 runs in 5. Wait
    // for the new, empty form first.
    await page.waitForFunction(() => location.hash === "#/trace" && document.getElementById("trace-id")?.value === "");
    await page.getByLabel("Any id").fill(duplicate);
    await page.getByRole("button", { name: "Trace" }).click();
    const flagged = page.locator(".chain .node-duplicate.tone-bad");
    await flagged.waitFor();
    const text = await flagged.innerText();
    assert.ok(text.includes(`object ${duplicate}`) && text.includes(`confirmed: ${settled.external_id}`), text);
    assert.equal(await page.locator(".chain .matched .node-label").innerText(), "Duplicate detected (your id)");
    await axe(page, "trace with a duplicate");
    await shot(page, "trace-duplicate");
    await page.getByRole("link", { name: "Overview" }).click();
    await page.locator(".stat", { hasText: "Duplicates detected" }).locator(".stat-number", { hasText: /^1$/ }).waitFor();
  });

  await check("listings filter by state and page", async () => {
    await page.goto("/console#/operations?state=succeeded");
    await page.locator("table.listing tbody tr").nth(1).waitFor();
    const states = await page.locator("table.listing tbody .badge").allInnerTexts();
    assert.ok(states.every((s) => s === "succeeded"), states.join());
    await axe(page, "operations");
    await shot(page, "operations");
  });

  await check("an operator sees a failing webhook endpoint, its attempts, and pauses and resumes it", async () => {
    await page.getByRole("link", { name: "Webhooks" }).click();
    const endpoint = page.locator('article[data-endpoint="ops-feed"]');
    // Its receiver is gone: the first event is retried with growing pauses, and the badge says
    // so instead of a green "active".
    await endpoint.getByText(/retrying the event at position \d+/).waitFor();
    await endpoint.locator("h2 .badge", { hasText: /^(retrying|failing)$/ }).waitFor();
    assert.equal(await endpoint.locator("h2 .badge-ok").count(), 0, "a failing endpoint is not shown green");
    await axe(page, "webhooks");
    await shot(page, "webhooks");
    await endpoint.getByRole("link", { name: "Delivery attempts" }).click();
    const rows = page.locator("table.attempts tbody tr");
    await rows.first().waitFor();
    const first = await rows.first().innerText();
    assert.ok(first.includes("no answer") && /#\d+/.test(first), first);
    await axe(page, "webhook attempts");
    // An attempt shows its payload on request and links to its operation, whose page lists the
    // operation's deliveries: which endpoint, how many attempts, the last answer and error.
    await rows.first().getByRole("button", { name: /Show the payload/ }).click();
    const payload = JSON.parse(await rows.first().locator(".payload pre").innerText());
    assert.match(payload.type, /^operation\./, JSON.stringify(payload));
    const operationLink = rows.first().locator("td[data-label=Operation] a");
    assert.equal(await operationLink.getAttribute("title"), payload.data.operation_id);
    await operationLink.click();
    const delivery = page.locator('section.deliveries tr[data-endpoint="ops-feed"]').first();
    await delivery.waitFor();
    const deliveryText = await delivery.innerText();
    assert.ok(deliveryText.includes("failing") && deliveryText.includes("no answer"), deliveryText);
    assert.notEqual(await delivery.locator("td[data-label='Last error']").innerText(), "—", deliveryText);
    await axe(page, "an operation's webhook deliveries");
    await shot(page, "operation-deliveries");
    await page.goBack();
    await rows.first().waitFor();
    await page.getByRole("link", { name: "All webhook endpoints" }).click();
    await endpoint.getByRole("button", { name: "Pause deliveries" }).click();
    await endpoint.getByText("paused", { exact: true }).waitFor();
    await endpoint.getByText("paused by oncall", { exact: true }).waitFor();
    const listed = await api("GET", "/v1/webhooks", OPERATOR);
    assert.equal(listed.json.endpoints.find((e) => e.id === "ops-feed").status, "paused", JSON.stringify(listed.json));
    await endpoint.getByRole("button", { name: "Resume deliveries" }).click();
    await endpoint.getByRole("button", { name: "Pause deliveries" }).waitFor();
    // A replay from something that is neither a position nor a time is refused on the page.
    await endpoint.getByLabel("Deliver again from").fill("yesterday");
    await endpoint.getByRole("button", { name: "Replay" }).click();
    await endpoint.getByRole("alert").filter({ hasText: "log position" }).waitFor();
    // A replay asks first, says what it will do, and shows what it did.
    await endpoint.getByLabel("Deliver again from").fill("0");
    await endpoint.getByRole("button", { name: "Replay" }).click();
    await endpoint.getByRole("alertdialog").filter({ hasText: "Deliver every event from the beginning to ops-feed again?" }).waitFor();
    await endpoint.getByRole("button", { name: "Yes, deliver again" }).click();
    await endpoint.locator(".done", { hasText: /replaying from position 0; \d+ log positions to go through again/ }).waitFor();
  });

  await check("an operator adds an endpoint on the page without a restart, tests it, rotates its secret and deletes it", async () => {
    // The same gone receiver as ops-feed's: the test event's failure is what the page shows.
    const gone = (await api("GET", "/v1/webhooks", OPERATOR)).json.endpoints.find((e) => e.id === "ops-feed").url;
    await page.getByRole("link", { name: "Webhooks" }).click();
    await page.getByLabel("Name").fill("crm-feed");
    await page.getByLabel("URL").fill("https://169.254.169.254/latest");
    await page.getByRole("button", { name: "Add endpoint" }).click();
    await page.getByText(/private or link-local address/).waitFor();
    await page.getByLabel("URL").fill(gone);
    await page.getByRole("button", { name: "Add endpoint" }).click();
    const secret = await page.locator("code.secret").innerText();
    assert.match(secret, /^whsec_/);
    const added = page.locator('article[data-endpoint="crm-feed"]');
    await added.getByText("the API (change it here)").waitFor();
    await added.getByRole("button", { name: "Send a test event" }).click();
    await added.locator(".done", { hasText: /crm-feed: test event (failed|answered HTTP)/ }).waitFor();
    await added.getByRole("button", { name: "Rotate secret" }).click();
    await added.getByRole("button", { name: "Yes, do it" }).click();
    const rotated = await added.locator("code.secret").innerText();
    assert.ok(rotated.startsWith("whsec_") && rotated !== secret, "a new secret is shown");
    await axe(page, "webhooks with an endpoint added");
    await shot(page, "webhooks-added");
    await added.getByRole("button", { name: "Delete endpoint" }).click();
    await added.getByRole("button", { name: "Yes, do it" }).click();
    await added.waitFor({ state: "detached" });
    const listed = await api("GET", "/v1/webhooks", OPERATOR);
    assert.deepEqual(listed.json.endpoints.map((e) => e.id), ["ops-feed"]);
  });

  await check("at a phone's width the decision and the timeline fit without sideways scrolling", async () => {
    await loseNextCreates(1);
    const third = await lostTask("Call Clara about the contract");
    const phone = await newPage(PHONE);
    await signIn(phone, OPERATOR);
    await phone.goto(`/console#/review/${third}`);
    await phone.locator("#decide-heading").waitFor();
    await noSidewaysScroll(phone, "the decision form");
    await shot(phone, "phone-decide");
    // By keyboard alone: the in-page link moves focus to the form; arrows pick a choice; Tab
    // reaches the note and the button.
    await phone.getByRole("link", { name: "record your decision" }).focus();
    await phone.keyboard.press("Enter");
    assert.equal(await phone.evaluate(() => document.activeElement.id), "decide-heading");
    await phone.keyboard.press("Tab");
    assert.equal(await phone.evaluate(() => document.activeElement.name), "decision", "Tab reaches the choices");
    await phone.keyboard.press("ArrowDown");
    await phone.keyboard.press("ArrowDown");
    assert.equal(await phone.evaluate(() => document.activeElement.value), "abandon");
    await phone.keyboard.press("Space");
    await phone.keyboard.press("Tab");
    await phone.keyboard.type("the client asked to drop it");
    await phone.keyboard.press("Tab");
    await phone.keyboard.press("Enter");
    await phone.locator(".done", { hasText: "Decision recorded" }).waitFor();
    assert.equal((await stateOf(third)).state, "abandoned");
    await phone.goto(`/console#/operation/${second}`);
    await phone.locator("li[data-type=AttemptSucceeded]").waitFor();
    await noSidewaysScroll(phone, "the timeline");
    await shot(phone, "phone-timeline");
    await phone.close();
  });

  await check("an operator scoped to tenant B never sees tenant A's operations", async () => {
    const scoped = await newPage(LAPTOP);
    await signIn(scoped, OPERATOR_B);
    await scoped.locator("h1", { hasText: "Review queue" }).waitFor();
    await scoped.locator(".queue .empty").waitFor();
    await scoped.goto("/console#/operations");
    await scoped.locator("main .empty, table.listing").first().waitFor();
    const listed = await scoped.locator("main").innerText();
    for (const id of [first, second]) assert.ok(!listed.includes(id.slice(0, 8)), `tenant A's ${id} is listed`);
    await scoped.goto(`/console#/operation/${first}`);
    await scoped.getByRole("alert").filter({ hasText: "not_found" }).waitFor();
    await scoped.goto(`/console#/trace/${second}`);
    await scoped.getByRole("alert").filter({ hasText: "not_found" }).waitFor();
    // A token the server stops accepting sends the person back to sign-in, saying why.
    await scoped.evaluate(() => sessionStorage.setItem("opledger.token", "a-token-this-server-never-issued"));
    await scoped.goto("/console#/operations");
    await scoped.getByRole("alert").filter({ hasText: "no longer accepts the token" }).waitFor();
    await scoped.getByLabel("Access token").waitFor();
    assert.equal(await scoped.evaluate(() => sessionStorage.getItem("opledger.token")), null);
    await scoped.close();
  });

  await check("an operator who sees two tenants gets both counted, and a tenant named in the URL never sticks", async () => {
    const both = await newPage(LAPTOP);
    await signIn(both, OPERATOR_AB);
    await both.getByRole("link", { name: "Overview" }).click();
    await both.getByText("Counting every tenant this token sees.").waitFor();
    await both.getByLabel("Tenant", { exact: true }).fill("tenant-a");
    await axe(both, "tenant choice");
    await both.getByRole("button", { name: "Count" }).click();
    await both.getByText("Counting tenant tenant-a only.").waitFor();
    await both.locator(".stat-succeeded .stat-number", { hasText: /^[1-9]/ }).waitFor();
    await both.getByRole("link", { name: "Operations" }).click();
    await both.locator("h1", { hasText: "Operations" }).waitFor();
    // Nothing was remembered: the listing asks for a tenant rather than quietly using one.
    assert.equal(await both.getByLabel("Tenant", { exact: true }).inputValue(), "");
    await both.getByRole("alert").filter({ hasText: "name one in the Tenant field" }).waitFor();
    await both.getByLabel("Tenant", { exact: true }).fill("tenant-a");
    await both.getByRole("button", { name: "Show" }).click();
    await both.locator(`table.listing a[title="${second}"]`).waitFor();
    await both.close();
  });

  await check("a tenant approves exactly the snapshot shown, and is offered no review queue", async () => {
    const recorded = await api("POST", "/v1/operations", TENANT_A, {
      provider: "crm",
      account: ACCOUNT,
      action: "create_task",
      args: { title: "Send the contract to Dana" },
      requires_approval: true,
    });
    assert.equal(recorded.status, 201, JSON.stringify(recorded.json));
    const tenant = await newPage(LAPTOP);
    await signIn(tenant, TENANT_A);
    assert.deepEqual(await tenant.locator("#nav [data-role=operator]").evaluateAll((items) => items.map((item) => item.hidden)), [true, true], "no review queue or webhooks for a tenant");
    await tenant.getByRole("link", { name: "Approvals" }).click();
    await tenant.getByText(recorded.json.args_hash).waitFor();
    await axe(tenant, "approvals");
    await shot(tenant, "approvals");
    await tenant.getByLabel(/Your name/).fill("Erin from sales");
    await tenant.getByRole("button", { name: "Approve this snapshot" }).click();
    await tenant.locator(".done", { hasText: "Approved" }).waitFor();
    await tenant.close();
  });

  await check("tenant B's approver denies with a reason, and tenant B's own token is told it cannot approve", async () => {
    const recorded = await api("POST", "/v1/operations", TENANT_B, {
      provider: "crm",
      account: ACCOUNT,
      action: "create_task",
      args: { title: "Refund the whole order" },
      requires_approval: true,
    });
    assert.equal(recorded.status, 201, JSON.stringify(recorded.json));
    const id = recorded.json.operation_id;
    const own = await newPage(LAPTOP);
    await signIn(own, TENANT_B);
    await own.getByRole("link", { name: "Approvals" }).click();
    await own.getByText(recorded.json.args_hash).waitFor();
    await own.getByLabel(/Your name/).fill("Frank");
    await own.getByRole("button", { name: "Approve this snapshot" }).click();
    await own.getByRole("alert").filter({ hasText: "need an approver token" }).waitFor();
    await own.close();
    const approver = await newPage(LAPTOP);
    await signIn(approver, APPROVER_B);
    await approver.getByRole("link", { name: "Approvals" }).click();
    await approver.getByText(recorded.json.args_hash).waitFor();
    await approver.getByRole("button", { name: "Deny" }).click();
    await approver.getByRole("alert").filter({ hasText: "reason" }).waitFor();
    await approver.getByLabel(/Reason/).fill("a whole-order refund needs a manager");
    await approver.getByRole("button", { name: "Deny" }).click();
    await approver.locator(".done", { hasText: "Denied" }).waitFor();
    assert.equal((await api("GET", `/v1/operations/${id}`, TENANT_B)).json.state, "denied");
    await approver.close();
  });

  await check("a long argument is collapsed behind its beginning, and the owner is shown", async () => {
    await loseNextCreates(1);
    const recorded = await api("POST", "/v1/operations?execute=true&wait_ms=200", TENANT_A, {
      provider: "crm-plain",
      account: ACCOUNT,
      action: "create_task",
      owner: "anna.k",
      args: { title: "Call Dora about the long brief", notes: "A pasted brief. ".repeat(640) },
    });
    assert.ok([200, 201].includes(recorded.status), JSON.stringify(recorded.json));
    const id = recorded.json.operation_id;
    await page.goto(`/console#/operation/${id}`);
    await page.locator(".summary").getByText("anna.k").waitFor();
    for (let tries = 0; (await stateOf(id)).state !== "needs_review"; tries += 1) {
      assert.ok(tries < 100, "the lost task reaches the review queue");
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await page.goto(`/console#/review/${id}`);
    await page.locator("#decide-heading").waitFor();
    const collapsed = page.locator("details.long-argument");
    await collapsed.waitFor();
    assert.match(await collapsed.locator("summary").innerText(), /10,240 characters; show all/);
    assert.equal(await collapsed.evaluate((node) => node.open), false, "closed until asked");
    const box = await page.locator("table.args").boundingBox();
    assert.ok(box.height < 400, `the arguments take ${box.height}px, not a screenful`);
    await page.locator(".summary, .why").first().waitFor();
    // Dark mode, when the system asks for it: every text still at AA contrast.
    await page.emulateMedia({ colorScheme: "dark" });
    assert.equal(await page.evaluate(() => getComputedStyle(document.documentElement).backgroundColor), "rgb(13, 17, 23)");
    await axe(page, "decision form in dark mode");
    await shot(page, "decide-dark");
    await page.emulateMedia({ colorScheme: "light" });
    await api("POST", `/v1/operations/${id}/review`, OPERATOR, { decision: "abandon", note: "a test item" });
  });

  assert.deepEqual(problems, [], "the browser reported problems");
  assert.equal(inlineRefusals.length, 1, `only the injected script is refused: ${inlineRefusals.join("\n")}`);

  console.log("all console checks passed");
} catch (error) {
  console.error(`FAILED at: ${step}\n${error.stack ?? error}`);
  if (problems.length) console.error(`browser problems:\n${problems.join("\n")}`);
  process.exitCode = 1;
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}
