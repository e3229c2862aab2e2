// The committed generated files are what the tools make now: the OpenAPI types from the document
// the running server serves (a change to the API without `npm run generate` fails here), the
// declarations from the sources' JSDoc, and the sources type-check (strict) against both.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { env } from "./support.js";

const root = fileURLToPath(new URL("..", import.meta.url));
const bin = (/** @type {string} */ name) => join(root, "node_modules", ".bin", name);
const run = (/** @type {string} */ name, /** @type {string[]} */ args) =>
  execFileSync(bin(name), args, { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });

test("the committed OpenAPI types are those generated from the served document", async () => {
  const response = await fetch(`${env("OPLEDGER_BASE_URL")}/v1/openapi.json`);
  assert.equal(response.status, 200);
  const scratch = mkdtempSync(join(tmpdir(), "opledger-openapi-"));
  const served = join(scratch, "openapi.json");
  writeFileSync(served, await response.text());
  const generated = join(scratch, "openapi.d.ts");
  run("openapi-typescript", [served, "-o", generated]);
  const committed = readFileSync(join(root, "types", "openapi.d.ts"), "utf8");
  assert.equal(
    readFileSync(generated, "utf8"), committed,
    "types/openapi.d.ts differs from the served document's types: run `npm run generate` in clients/typescript",
  );
});

test("the committed declarations are those tsc emits from the sources", () => {
  const scratch = mkdtempSync(join(tmpdir(), "opledger-types-"));
  run("tsc", ["-p", "tsconfig.types.json", "--outDir", scratch]);
  const emitted = readdirSync(scratch).sort();
  assert.ok(emitted.length >= 4, emitted.join(", "));
  for (const file of emitted) {
    assert.equal(
      readFileSync(join(scratch, file), "utf8"), readFileSync(join(root, "types", file), "utf8"),
      `types/${file} differs from what tsc emits: run \`npm run generate\` in clients/typescript`,
    );
  }
});

test("the sources type-check against the generated types", () => {
  try {
    run("tsc", ["-p", "tsconfig.json"]);
  } catch (error) {
    assert.fail(`tsc --noEmit found type errors:\n${/** @type {any} */ (error).stdout}`);
  }
});
