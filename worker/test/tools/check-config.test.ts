// tools/check-config.mjs: the deploy gate. It refuses the repository's template (placeholders
// for the account and bucket) and accepts it filled in; --template accepts the placeholders.
// A worker pool is accepted only with what it needs (its URL, its token, room in max_instances).
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

/** The config with a worker pool of `pool` reached at `url`, and SKIFF_WORKER_TOKEN required. */
function withPool(config: string, pool: string, url: string): string {
  return config
    .replace('"SKIFF_WORKER_POOL": "0"', `"SKIFF_WORKER_POOL": "${pool}"`)
    .replace('"SKIFF_PUBLIC_URL": ""', `"SKIFF_PUBLIC_URL": "${url}"`)
    .replace('"required": ["API_TOKEN", "CF_API_TOKEN"]', '"required": ["API_TOKEN", "CF_API_TOKEN", "SKIFF_WORKER_TOKEN"]');
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

  it("accepts a worker pool with its https URL, a max_instances that fits and the token required", () => {
    const filled = template.replaceAll("<ACCOUNT_ID>", "0123abcd").replaceAll("<BUCKET>", "analytics");
    const pooled = withPool(filled, "3", "https://skiff.example.workers.dev");
    const r = run(pooled);
    expect(r.out).toContain("wrangler.jsonc is wired correctly");
    expect(r.out).toContain("ok   with SKIFF_WORKER_POOL 3, secrets.required lists SKIFF_WORKER_TOKEN");
    expect(r.ok).toBe(true);
  });

  it("refuses a worker pool without its URL, with an http or pathed URL, without the token required, or larger than max_instances", () => {
    const filled = template.replaceAll("<ACCOUNT_ID>", "0123abcd").replaceAll("<BUCKET>", "analytics");
    const good = withPool(filled, "3", "https://skiff.example.workers.dev");
    for (const [broken, why] of [
      [withPool(filled, "3", ""), "with SKIFF_WORKER_POOL 3, SKIFF_PUBLIC_URL is this Worker's https origin"],
      [withPool(filled, "3", "http://skiff.example.workers.dev"), "with SKIFF_WORKER_POOL 3, SKIFF_PUBLIC_URL is this Worker's https origin"],
      [withPool(filled, "3", "https://skiff.example.workers.dev/api"), "with SKIFF_WORKER_POOL 3, SKIFF_PUBLIC_URL is this Worker's https origin"],
      [good.replace('"required": ["API_TOKEN", "CF_API_TOKEN", "SKIFF_WORKER_TOKEN"]', '"required": ["API_TOKEN", "CF_API_TOKEN"]'), "with SKIFF_WORKER_POOL 3, secrets.required lists SKIFF_WORKER_TOKEN"],
      [withPool(filled, "5", "https://skiff.example.workers.dev"), "SkiffWorkerContainer's max_instances (4) >= SKIFF_WORKER_POOL (5)"],
      [filled.replace('"SKIFF_WORKER_POOL": "0"', '"SKIFF_WORKER_POOL": "two"'), "SKIFF_WORKER_POOL (two) is a number of worker containers"],
      [filled.replace('"SKIFF_PUBLIC_URL": ""', '"SKIFF_PUBLIC_URL": "", "SKIFF_WORKER_TOKEN": "x"'), "SKIFF_WORKER_TOKEN is not a plain var"],
      [filled.replace('"SKIFF_PUBLIC_URL": ""', '"SKIFF_PUBLIC_URL": "", "SKIFF_WORKERS": "wss://elsewhere/_worker/0"'), "SKIFF_WORKERS is not a var"],
    ]) {
      expect(broken, why).not.toBe(filled);
      const r = run(broken!);
      expect(r.ok, why).toBe(false);
      expect(r.out).toContain(`FAIL ${why}`);
    }
  });

  it("refuses a config without the worker class, its binding or its migration, and an edited first migration", () => {
    const filled = template.replaceAll("<ACCOUNT_ID>", "0123abcd").replaceAll("<BUCKET>", "analytics");
    for (const [broken, why] of [
      [filled.replace('{ "class_name": "SkiffWorkerContainer", "name": "SKIFF_WORKER" }', ""), "Durable Object binding SKIFF_WORKER -> SkiffWorkerContainer"],
      [filled.replace(/,\s*\{ "tag": "v2", "new_sqlite_classes": \["SkiffWorkerContainer"\] \}/, ""), "a migration creates SkiffWorkerContainer as a SQLite class"],
      [
        filled
          .replace(/,\s*\{ "tag": "v2", "new_sqlite_classes": \["SkiffWorkerContainer"\] \}/, "")
          .replace('"new_sqlite_classes": ["SkiffContainer"]', '"new_sqlite_classes": ["SkiffContainer", "SkiffWorkerContainer"]'),
        "the first migration is still",
      ],
      [filled.replace('"class_name": "SkiffWorkerContainer",\n', '"class_name": "SkiffOther",\n'), "two containers, classes SkiffContainer and SkiffWorkerContainer"],
    ]) {
      expect(broken, why).not.toBe(filled);
      const r = run(broken!);
      expect(r.ok, why).toBe(false);
      expect(r.out).toContain(`FAIL ${why}`);
    }
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
