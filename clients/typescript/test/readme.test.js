// The book's framework examples stay true to the package: each is valid JavaScript as it
// stands (they use no type syntax, so a user can paste them into an .mjs file too), and every
// name they import from opledger-client is one the module exports.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { env } from "./support.js";

/** The ```ts blocks of the page's TypeScript section. */
function examples() {
  const readme = readFileSync(env("OPLEDGER_CLIENTS_PAGE"), "utf8");
  const start = readme.indexOf("### From TypeScript");
  assert.ok(start >= 0, "the page has a TypeScript section");
  const section = readme.slice(start, readme.indexOf("\n## ", start));
  return [...section.matchAll(/```ts\n([\s\S]*?)```/g)].map((match) => match[1]);
}

const SUBPATHS = { "opledger-client": "../src/index.js", "opledger-client/ai-sdk": "../src/ai-sdk.js",
  "opledger-client/openai-agents": "../src/openai-agents.js", "opledger-client/langchain": "../src/langchain.js" };

test("every framework example parses and imports only what the package exports", async () => {
  const blocks = examples();
  assert.equal(blocks.length, 3, "one example per framework");
  const scratch = mkdtempSync(join(tmpdir(), "opledger-readme-"));
  for (const [index, code] of blocks.entries()) {
    const file = join(scratch, `example-${index}.mjs`);
    writeFileSync(file, code);
    execFileSync(process.execPath, ["--check", file]);
    const imports = [...code.matchAll(/import \{([^}]*)\} from "(opledger-client[^"]*)"/g)];
    assert.ok(imports.length > 0, `example ${index} imports the package`);
    for (const [, names, from] of imports) {
      const path = SUBPATHS[/** @type {keyof typeof SUBPATHS} */ (from)];
      assert.ok(path, `${from} is one of the package's exports`);
      const module = await import(new URL(path, import.meta.url).href);
      for (const name of names.split(",").map((n) => n.trim()).filter(Boolean)) {
        assert.equal(typeof module[name], "function", `${from} exports ${name}`);
      }
    }
  }
});
