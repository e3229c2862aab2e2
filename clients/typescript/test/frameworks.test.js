// Each framework adapter through the framework's own invocation entry point, with no real model:
// the Vercel AI SDK's generateText over its MockLanguageModelV3, the OpenAI Agents SDK's run()
// over a scripted Model, LangChain's tool.invoke with a ToolCall. Each plays a response lost at
// the CRM: the first tool call answers "not confirmed, do not repeat" (an answer, not an error),
// the framework's repeat of the same tool call (same tool-call id) finds the same operation, the
// CRM holds one object, and the answer is "Done: … object N".

import assert from "node:assert/strict";
import { test } from "node:test";

import { tool as langchainTool } from "@langchain/core/tools";
import { Agent, run, setTracingDisabled, tool as openaiTool, Usage } from "@openai/agents";
import { generateText, jsonSchema, tool as aiTool } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";

import * as aiSdk from "../src/ai-sdk.js";
import * as langchain from "../src/langchain.js";
import * as openaiAgents from "../src/openai-agents.js";
import { Ledger } from "../src/index.js";
import {
  account, assertDoneSentence, assertNotConfirmedSentence, env, faultyProxy, ledger, stand, title, untilSettled,
} from "./support.js";

// The SDK would export traces to OpenAI; these tests reach only 127.0.0.1.
setTracingDisabled(true);

const CREATE_TASK = () => ({ provider: "crm-plain", account: account(), action: "create_task" });
/** A short wait: the first answer comes before the plain CRM's search (lag 200 ms) shows the task. */
const SHORT = { waitMs: 100 };
const WAIT = { waitMs: 5000 };

/**
 * The scenario every adapter must pass: `call(id)` is one framework-driven tool call with the
 * tool-call id `id`, answering the tool's text.
 * @param {string} task the task's title, which `call` sends
 * @param {(toolCallId: string) => Promise<string>} call
 */
async function lostResponseThenRetry(task, call) {
  const id = `call-${task}`;
  await stand.dropNextResponse("plain");
  const first = await call(id);
  assertNotConfirmedSentence(first);
  // The ledger reconciles it (the plain CRM is searched for the operation's label).
  const client = ledger();
  const [only] = (await client.list({ provider: "crm-plain", limit: 1000 })).operations.filter(
    (item) => item.source_id === id,
  );
  assert.ok(only, `an operation recorded under the tool-call id ${id}`);
  await untilSettled(client, only.operation_id);
  const retried = await call(id);
  const objects = await stand.objectsTitled(task);
  assert.equal(objects.length, 1, JSON.stringify(objects));
  assertDoneSentence(retried, objects[0].id);
}

/** A Vercel AI SDK model that asks for one tool call, with `toolCallId`. */
function toolCallingModel(/** @type {string} */ toolName, /** @type {string} */ toolCallId, /** @type {object} */ input) {
  return new MockLanguageModelV3({
    doGenerate: async () => ({
      finishReason: { unified: "tool-calls", raw: undefined },
      usage: {
        inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
        outputTokens: { total: 1, text: 1, reasoning: 0 },
      },
      content: [{ type: "tool-call", toolCallId, toolName, input: JSON.stringify(input) }],
      warnings: [],
    }),
  });
}

test("Vercel AI SDK: a lost response then the SDK's repeat of the tool call makes one task", async () => {
  const task = title("ai-sdk");
  const tools = {
    create_task: aiTool({
      description: "Create a task in the CRM.",
      inputSchema: z.object({ title: z.string() }),
      execute: aiSdk.guardedExecute(ledger(), CREATE_TASK(), SHORT),
    }),
  };
  await lostResponseThenRetry(task, async (id) => {
    const result = await generateText({ model: toolCallingModel("create_task", id, { title: task }), tools, prompt: "Set a task" });
    assert.equal(result.toolResults.length, 1, JSON.stringify(result.content));
    return String(result.toolResults[0].output);
  });
});

test("Vercel AI SDK: the tools from GET /v1/actions act in the account the model names", async () => {
  const tools = await aiSdk.ledgerTools(ledger(), WAIT);
  assert.ok(tools["crm__create_task"] && tools["crm_plain__create_task"], Object.keys(tools).join(", "));
  const task = title("ai-sdk-actions");
  const model = toolCallingModel("crm__create_task", "actions-call-1", { title: task, account: account() });
  const result = await generateText({ model, tools, prompt: "Set a task" });
  const [object] = await stand.objectsTitled(task);
  assertDoneSentence(String(result.toolResults[0].output), object.id);
});

/**
 * An OpenAI Agents SDK model that calls `toolName` once with `callId`, then ends the turn with
 * the tool's output as its text.
 * @param {string} toolName
 * @param {string} callId
 * @param {object} input
 * @returns {import("@openai/agents").Model}
 */
function scriptedModel(toolName, callId, input) {
  return {
    async getResponse(request) {
      const items = Array.isArray(request.input) ? request.input : [];
      const output = items.find((/** @type {any} */ item) => item.type === "function_call_result");
      if (output) {
        const text = /** @type {any} */ (output).output;
        return {
          usage: new Usage(),
          output: [{
            type: "message", role: "assistant", status: "completed",
            content: [{ type: "output_text", text: typeof text === "string" ? text : text.text }],
          }],
        };
      }
      return {
        usage: new Usage(),
        output: [{ type: "function_call", callId, name: toolName, arguments: JSON.stringify(input), status: "completed" }],
      };
    },
    // eslint-disable-next-line require-yield
    async *getStreamedResponse() {
      throw new Error("not streamed in these tests");
    },
  };
}

test("OpenAI Agents SDK: a lost response then the run's repeat of the function call makes one task", async () => {
  const task = title("openai-agents");
  const createTask = openaiTool({
    name: "create_task",
    description: "Create a task in the CRM.",
    parameters: z.object({ title: z.string() }),
    execute: openaiAgents.guardedExecute(ledger(), CREATE_TASK(), SHORT),
  });
  await lostResponseThenRetry(task, async (id) => {
    const agent = new Agent({ name: "assistant", model: scriptedModel("create_task", id, { title: task }), tools: [createTask] });
    const result = await run(agent, "Set a task");
    return String(result.finalOutput);
  });
});

test("OpenAI Agents SDK: the tools from GET /v1/actions act in the account the model names", async () => {
  const tools = await openaiAgents.ledgerTools(ledger(), WAIT);
  const task = title("openai-agents-actions");
  const model = scriptedModel("crm__create_task", "actions-call-2", { title: task, account: account() });
  const result = await run(new Agent({ name: "assistant", model, tools }), "Set a task");
  const [object] = await stand.objectsTitled(task);
  assertDoneSentence(String(result.finalOutput), object.id);
});

test("LangChain.js: a lost response then invoking the same ToolCall again makes one task", async () => {
  const task = title("langchain");
  const createTask = langchainTool(langchain.guardedFunc(ledger(), CREATE_TASK(), SHORT), {
    name: "create_task",
    description: "Create a task in the CRM.",
    schema: z.object({ title: z.string() }),
  });
  await lostResponseThenRetry(task, async (id) => {
    const message = await createTask.invoke({ type: "tool_call", id, name: "create_task", args: { title: task } });
    assert.equal(message.tool_call_id, id);
    return String(message.content);
  });
});

test("LangChain.js: the tools from GET /v1/actions act in the account the model names", async () => {
  const tools = await langchain.ledgerTools(ledger(), WAIT);
  const keyed = tools.find((t) => t.name === "crm__create_task");
  assert.ok(keyed, tools.map((t) => t.name).join(", "));
  const task = title("langchain-actions");
  const message = await keyed.invoke({
    type: "tool_call", id: "actions-call-3", name: "crm__create_task", args: { title: task, account: account() },
  });
  const [object] = await stand.objectsTitled(task);
  assertDoneSentence(String(message.content), object.id);
});

// ---- refusals and repeats, through each framework ----

/**
 * `call(id, title)` is one framework-driven tool call; under an id that already named another
 * request the ledger refuses it (409), and the framework hands the API's message to the model
 * instead of ending the run.
 * @param {(toolCallId: string, task: string) => Promise<string>} call
 */
async function refusedThen(call) {
  const id = `reused-${title("refused")}`;
  await ledger().record({ ...CREATE_TASK(), args: { title: "the first request" } }, { idempotencyKey: id });
  const said = await call(id, "another request");
  assert.match(said, /idempotency_key_reused/, said);
  assert.match(said, /idempotency/i, said);
  assert.doesNotMatch(said, /^Done/);
}

/**
 * `call(client, id, title)` through a proxy whose first record is answered 503 after the server
 * recorded it: the client repeats it under the same key, and the CRM holds one task.
 * @param {(client: Ledger, toolCallId: string, task: string) => Promise<string>} call
 */
async function repeatedAfterA503(call) {
  const proxy = await faultyProxy(env("OPLEDGER_BASE_URL"));
  try {
    const client = new Ledger(proxy.url, { token: env("OPLEDGER_TOKEN"), sleep: async () => {} });
    const task = title("after a 503");
    proxy.faults.push("503_after");
    const said = await call(client, `call-${task}`, task);
    const objects = await stand.objectsTitled(task);
    assert.equal(objects.length, 1, JSON.stringify(objects));
    assertDoneSentence(said, objects[0].id);
    assert.equal(proxy.keys.length, 2, JSON.stringify(proxy.keys));
    assert.equal(proxy.keys[0], proxy.keys[1]);
  } finally {
    await proxy.close();
  }
}

/** @param {Ledger} client @param {string} id @param {string} task */
async function aiSdkCall(client, id, task) {
  const tools = {
    create_task: aiTool({
      description: "Create a task in the CRM.",
      inputSchema: z.object({ title: z.string() }),
      execute: aiSdk.guardedExecute(client, CREATE_TASK(), WAIT),
    }),
  };
  const result = await generateText({ model: toolCallingModel("create_task", id, { title: task }), tools, prompt: "Set a task" });
  const part = result.content.find((p) => p.type === "tool-result" || p.type === "tool-error");
  assert.ok(part, JSON.stringify(result.content));
  return part.type === "tool-result" ? String(part.output) : String(/** @type {any} */ (part).error?.message ?? part.error);
}

/** @param {Ledger} client @param {string} id @param {string} task */
async function openaiAgentsCall(client, id, task) {
  const createTask = openaiTool({
    name: "create_task",
    description: "Create a task in the CRM.",
    parameters: z.object({ title: z.string() }),
    execute: openaiAgents.guardedExecute(client, CREATE_TASK(), WAIT),
  });
  const agent = new Agent({ name: "assistant", model: scriptedModel("create_task", id, { title: task }), tools: [createTask] });
  return String((await run(agent, "Set a task")).finalOutput);
}

/** @param {Ledger} client @param {string} id @param {string} task @param {string} [status] */
async function langchainCall(client, id, task, status = "success") {
  const createTask = langchainTool(langchain.guardedFunc(client, CREATE_TASK(), WAIT), {
    name: "create_task",
    description: "Create a task in the CRM.",
    schema: z.object({ title: z.string() }),
  });
  const message = await createTask.invoke({ type: "tool_call", id, name: "create_task", args: { title: task } });
  assert.equal(message.status ?? "success", status, JSON.stringify(message));
  return String(message.content);
}

test("Vercel AI SDK: a refusal is the tool call's tool-error with the API's message", async () => {
  await refusedThen((id, task) => aiSdkCall(ledger(), id, task));
});

test("OpenAI Agents SDK: a refusal is the tool's output with the API's message, and the run goes on", async () => {
  await refusedThen((id, task) => openaiAgentsCall(ledger(), id, task));
});

test("LangChain.js: a refusal is an error ToolMessage with the API's message", async () => {
  await refusedThen((id, task) => langchainCall(ledger(), id, task, "error"));
});

test("Vercel AI SDK: a 503 is repeated with the same key and makes one task", async () => {
  await repeatedAfterA503(aiSdkCall);
});

test("OpenAI Agents SDK: a 503 is repeated with the same key and makes one task", async () => {
  await repeatedAfterA503(openaiAgentsCall);
});

test("LangChain.js: a 503 is repeated with the same key and makes one task", async () => {
  await repeatedAfterA503((client, id, task) => langchainCall(client, id, task));
});

// Unused import guard: jsonSchema is what ledgerTools hands the SDK; importing it here keeps the
// test's SDK the adapter's SDK.
assert.equal(typeof jsonSchema, "function");
