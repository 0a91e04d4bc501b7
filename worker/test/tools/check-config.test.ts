// tools/check-config.mjs: the deploy gate. It refuses the repository's template (placeholders
// for the account and bucket) and accepts it filled in; --template accepts the placeholders.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

const worker = resolve(import.meta.dirname, "../..");
const template = readFileSync(join(worker, "..", "wrangler.jsonc"), "utf8");
const dir = mkdtempSync(join(tmpdir(), "skiff-check-config-test-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function run(config: string, ...args: string[]): { ok: boolean; out: string } {
  const path = join(dir, `wrangler-${Math.random().toString(36).slice(2)}.jsonc`);
  writeFileSync(path, config);
  try {
    const out = execFileSync(process.execPath, [join(worker, "tools/check-config.mjs"), "--config", path, ...args], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    });
    return { ok: true, out };
  } catch (e) {
    const err = e as { stdout?: string; stderr?: string };
    return { ok: false, out: `${err.stdout ?? ""}${err.stderr ?? ""}` };
  }
}

describe("check-config", () => {
  it("refuses the <ACCOUNT_ID>/<BUCKET> placeholders", () => {
    const r = run(template);
    expect(r.ok).toBe(false);
    expect(r.out).toMatch(/FAIL vars\.SKIFF_CATALOG_URI holds no placeholder/);
    expect(r.out).toMatch(/FAIL vars\.SKIFF_WAREHOUSE holds no placeholder/);
  });

  it("accepts the template filled in, and the template itself with --template", () => {
    const filled = template.replaceAll("<ACCOUNT_ID>", "0123abcd").replaceAll("<BUCKET>", "analytics");
    const r = run(filled);
    expect(r.out).toContain("wrangler.jsonc is wired correctly");
    expect(r.ok).toBe(true);
    expect(run(template, "--template").ok).toBe(true);
  });

  it("refuses a missing catalog, a missing required secret and an unknown location hint", () => {
    const filled = template.replaceAll("<ACCOUNT_ID>", "0123abcd").replaceAll("<BUCKET>", "analytics");
    for (const [broken, why] of [
      [filled.replace(/"SKIFF_CATALOG_URI": "[^"]*",/, ""), "vars.SKIFF_CATALOG_URI is set"],
      [filled.replace('"required": ["API_TOKEN", "CF_API_TOKEN"]', '"required": ["API_TOKEN"]'), "secrets.required lists CF_API_TOKEN"],
      [filled.replace('"SKIFF_LOCATION_HINT": ""', '"SKIFF_LOCATION_HINT": "mars"'), "SKIFF_LOCATION_HINT (mars)"],
    ]) {
      expect(broken, why).not.toBe(filled);
      const r = run(broken!);
      expect(r.ok, why).toBe(false);
      expect(r.out).toContain(`FAIL ${why}`);
    }
  });
});
