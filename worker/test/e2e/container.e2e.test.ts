// The production SkiffContainer class in workerd, its container a real skiff process (see
// fake-container.ts and launcher.ts): the environment it starts skiff with, readiness, the
// caller's view of a catalog that fails, token rotation (clients' and the catalog's) without a
// restart, deep health and the stop hook.
import { env, runInDurableObject } from "cloudflare:test";
import { afterAll, describe, expect, it } from "vitest";
import worker from "../../src/index";
import type { Env } from "../../src/index";
import { SKIFF_PORT, type SkiffContainer } from "../../src/container";

const e = env as unknown as Env & {
  SKIFF_CT: DurableObjectNamespace<SkiffContainer>;
  LAUNCHER: Fetcher;
  SKIFF_TEST_TOKEN: string;
  SKIFF_E2E_LAKE: string;
};
const TOKEN = e.SKIFF_TEST_TOKEN;
const BASIN = "/api/v1/accounts/acc/basin-sql/query/bucket";

/** The Worker, its SKIFF binding the real container class. */
function call(path: string, init: RequestInit = {}, override: Partial<Env> = {}): Promise<Response> {
  return worker.fetch(new Request(`https://skiff.example.com${path}`, init), { ...e, SKIFF: e.SKIFF_CT, ...override });
}

function query(sql: string, token = TOKEN, override: Partial<Env> = {}, path = "/query"): Promise<Response> {
  return call(path, { method: "POST", headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: JSON.stringify({ query: sql }) }, override);
}

interface Info {
  starts: number;
  env: Record<string, string> | null;
  port: number | null;
  running: boolean;
  log: string[];
}

async function info(name: string): Promise<Info> {
  const id = e.SKIFF_CT.idFromName(name).toString();
  return (await (await e.LAUNCHER.fetch(`http://launcher/info?id=${id}`)).json()) as Info;
}

async function sha256(s: string): Promise<string> {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(s)));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

async function eventually<T>(what: string, f: () => Promise<T | undefined>, ms = 20_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("SkiffContainer over a real skiff", () => {
  // Every process the tests started ends with them (SIGKILL, as the runtime's destroy does).
  afterAll(async () => {
    for (const name of ["skiff", "skiff-1"]) {
      if ((await info(name)).running) {
        await runInDurableObject(e.SKIFF_CT.getByName(name), (instance: SkiffContainer) => instance.destroy());
      }
    }
  });
  it("needs the environment it runs in", () => {
    if (!e.SKIFF_E2E_LAKE || !TOKEN) throw new Error("set SKIFF_E2E_LAKE, SKIFF_BIN and SKIFF_TEST_TOKEN (scripts/test does)");
  });

  it("starts skiff with its settings on port 8080, waits until it is ready, and forwards the query", async () => {
    const res = await query("SELECT count(*) AS n FROM glass.events");
    expect(res.status, await res.clone().text()).toBe(200);
    const [row] = (await res.json()) as { n: number }[];
    expect(row!.n).toBeGreaterThan(0);
    const i = await info("skiff");
    expect(i.starts).toBe(1);
    expect(SKIFF_PORT).toBe(8080);
    const vars = i.env!;
    expect(vars.SKIFF_HTTP_ADDR).toBe("0.0.0.0:8080");
    expect(vars.SKIFF_FLIGHT_ADDR).toBe("off");
    expect(vars.SKIFF_LOG_FORMAT).toBe("json");
    expect(vars.SKIFF_CATALOG_URI).toBe(e.SKIFF_CATALOG_URI);
    expect(vars.SKIFF_QUERY_HISTORY).toBe("77");
    expect(vars.CF_API_TOKEN).toBe("cf-token-1");
    // skiff's tokens are the instance's own, never a client's; the Worker's settings stay out.
    expect(vars.API_TOKEN).toMatch(/^[0-9a-f]{64}$/);
    expect(vars.SKIFF_ADMIN_TOKEN).toMatch(/^[0-9a-f]{64}$/);
    expect(vars.API_TOKEN).not.toBe(TOKEN);
    expect(Object.keys(vars)).not.toContain("SKIFF_INSTANCES");
    // No pool (SKIFF_WORKER_POOL unset): no workers, and the pool's token (a binding here) stays out.
    expect(Object.keys(vars)).not.toContain("SKIFF_WORKERS");
    expect(Object.keys(vars)).not.toContain("SKIFF_WORKER_TOKEN");
    // The settings took effect in skiff: JSON logs, and its own token at its door.
    const json = i.log.filter((l) => l.startsWith("{"));
    expect(json.length).toBeGreaterThan(0);
    expect(i.log.every((l) => l === "" || l.startsWith("{")), i.log.join("\n")).toBe(true);
    const direct = await fetch(`http://127.0.0.1:${i.port}/query`, {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify({ query: "SELECT 1" }),
    });
    expect(direct.status).toBe(401);
    // The Basin route through the class: Basin's envelope.
    const basin = await query("SELECT count(*) AS n FROM glass.events_v2", TOKEN, {}, BASIN);
    expect(basin.status).toBe(200);
    expect(((await basin.json()) as { success: boolean }).success).toBe(true);
  });

  it("a rotated client token works at once, the old one is refused, and skiff is not restarted", async () => {
    expect((await query("SELECT 1 AS one", "token-next", { API_TOKEN: `token-next,${TOKEN}` })).status).toBe(200);
    expect((await query("SELECT 1 AS one", TOKEN, { API_TOKEN: `token-next,${TOKEN}` })).status).toBe(200);
    const old = await query("SELECT 1 AS one", TOKEN, { API_TOKEN: "token-next" });
    expect(old.status).toBe(401);
    expect((await query("SELECT 1 AS one", "token-next", { API_TOKEN: "token-next" })).status).toBe(200);
    expect((await info("skiff")).starts).toBe(1);
  });

  it("a rotated catalog token is pushed to the running skiff before the next request", async () => {
    const stub = e.SKIFF_CT.getByName("skiff");
    const held = async () => {
      const { admin } = await runInDurableObject(stub, (instance: SkiffContainer) => instance.credentials());
      const i = await info("skiff");
      const r = await fetch(`http://127.0.0.1:${i.port}/_admin/credentials`, { headers: { authorization: `Bearer ${admin}` } });
      expect(r.status).toBe(200);
      return ((await r.json()) as { catalog_token_sha256: string | null }).catalog_token_sha256;
    };
    expect(await held()).toBe(await sha256("cf-token-1"));
    // What a `wrangler secret put CF_API_TOKEN` does to the object: a new env, the container kept.
    await runInDurableObject(stub, (instance: SkiffContainer) => {
      (instance as unknown as { env: Env }).env = { ...(instance as unknown as { env: Env }).env, CF_API_TOKEN: "cf-token-2" };
    });
    expect((await query("SELECT 1 AS one")).status).toBe(200);
    expect(await held()).toBe(await sha256("cf-token-2"));
    expect((await info("skiff")).starts).toBe(1);
    const i = await info("skiff");
    expect(i.log.join("\n")).not.toContain("cf-token-2");
  });

  it("deep health shows the running container and skiff's own health; plain health never reaches it", async () => {
    const auth = { authorization: `Bearer ${TOKEN}` };
    const deep = await call("/_health?deep=1", { headers: auth });
    expect(deep.status).toBe(200);
    const body = (await deep.json()) as { status: string; running: boolean; skiff: { status: number; body: { status: string } } };
    expect(body).toMatchObject({ status: "ok", running: true, skiff: { status: 200, body: { status: "ok" } } });
    const plain = await call("/_health");
    expect(await plain.json()).toEqual({ status: "ok" });
  });

  it("stopping the container runs the stop hook; the next request starts it again", async () => {
    const stub = e.SKIFF_CT.getByName("skiff");
    await runInDurableObject(stub, (instance: SkiffContainer) => instance.stop());
    await eventually("skiff exits on SIGTERM", async () => ((await info("skiff")).running ? undefined : true));
    const deep = await eventually("the stop is seen", async () => {
      const r = await call("/_health?deep=1", { headers: { authorization: `Bearer ${TOKEN}` } });
      const b = (await r.json()) as { status: string; running: boolean; state: { status: string; exitCode?: number } };
      return b.running ? undefined : b;
    });
    expect(deep.status).toBe("sleeping");
    expect((await info("skiff")).log.join("\n")).toContain("skiff stopped");
    // Not started by the health checks.
    expect((await info("skiff")).starts).toBe(1);
    const res = await query("SELECT 2 AS two");
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual([{ two: 2 }]);
    expect((await info("skiff")).starts).toBe(2);
  });

  it("a catalog skiff cannot reach reaches the caller as skiff's 503 with the cause, in both shapes", async () => {
    // Another instance whose catalog is missing: SKIFF_INSTANCES = 2 and a project id that picks skiff-1.
    let project = 0;
    while (fnv(`p${project}`) % 2 !== 1) project++;
    const stub = e.SKIFF_CT.getByName("skiff-1");
    await runInDurableObject(stub, (instance: SkiffContainer) => {
      const self = instance as unknown as { env: Env };
      self.env = { ...self.env, SKIFF_CATALOG_URI: `sqlite://${e.SKIFF_E2E_LAKE}/missing/catalog.db`, SKIFF_READY_TIMEOUT: "20s" };
    });
    const headers = { authorization: `Bearer ${TOKEN}`, "x-project-id": `p${project}` };
    const res = await call("/query", { method: "POST", headers, body: JSON.stringify({ query: "SELECT 1" }) }, { SKIFF_INSTANCES: "2" });
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBeTruthy();
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("starting");
    expect(body.error.message).toContain("missing/catalog.db");
    const basin = await call(BASIN, { method: "POST", headers, body: JSON.stringify({ query: "SELECT 1" }) }, { SKIFF_INSTANCES: "2" });
    expect(basin.status).toBe(503);
    const env = (await basin.json()) as { success: boolean; errors: { code: number; message: string }[] };
    expect(env.success).toBe(false);
    expect(env.errors[0]!.code).toBe(80001);
    expect(env.errors[0]!.message).toContain("missing/catalog.db");
  });
});

function fnv(s: string): number {
  let h = 0x811c9dc5;
  for (const b of new TextEncoder().encode(s)) {
    h ^= b;
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}
