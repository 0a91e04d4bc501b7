// Unit tests of the worker pool (distributed queries) in workerd: the `/_worker/<n>` route, the
// configuration it needs, and the environment both container classes start skiff with.
// SKIFF and SKIFF_WORKER are bound to the stand-in Durable Object (see stand-in.ts): Cloudflare's
// container runtime cannot run here; test/e2e/pool.e2e.test.ts runs the real `skiff worker`.
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import worker, { bearerMatches, configProblem, routeOf } from "../../src/index";
import type { Env } from "../../src/index";
import { SET_BY_CONTAINER, WORKER_ONLY, containerEnvVars, distribution, workerPoolSize, workerUrls } from "../../src/container";
import { WORKER_ENTRYPOINT, workerEnvVars } from "../../src/worker-container";
import type { Echo } from "./stand-in";

const testEnv = env as unknown as Env;
const WT = "w0rker-t0ken-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const WT_NEXT = "w0rker-t0ken-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
/** A pool of 2 reached through https://skiff.example.com. */
const POOL: Partial<Env> = { SKIFF_WORKER_POOL: "2", SKIFF_PUBLIC_URL: "https://skiff.example.com", SKIFF_WORKER_TOKEN: WT };
const UPGRADE = { upgrade: "websocket", authorization: `Bearer ${WT}` };

function call(path: string, init: RequestInit = {}, envOverride: Partial<Env> = {}): Promise<Response> {
  return worker.fetch(new Request(`https://skiff.example.com${path}`, init), { ...testEnv, ...envOverride });
}

/** Bindings that record any use: proves no container (coordinator or worker) was touched. */
function tripwires(): { bindings: Partial<Env>; touched: string[] } {
  const touched: string[] = [];
  const trap = (name: string) =>
    new Proxy(
      {},
      {
        get(_target, prop) {
          touched.push(`${name}.${String(prop)}`);
          throw new Error("container touched");
        },
      },
    );
  return { bindings: { SKIFF: trap("SKIFF") as Env["SKIFF"], SKIFF_WORKER: trap("SKIFF_WORKER") as Env["SKIFF_WORKER"] }, touched };
}

/** The next message on a WebSocket: text, or binary (a Blob at this compatibility date) as an ArrayBuffer. */
function nextMessage(ws: WebSocket, ms = 3000): Promise<string | ArrayBuffer> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no message")), ms);
    ws.addEventListener(
      "message",
      (e) => {
        clearTimeout(timer);
        if (e.data instanceof Blob) e.data.arrayBuffer().then(resolve, reject);
        else resolve(e.data as string | ArrayBuffer);
      },
      { once: true },
    );
  });
}

describe("/_worker/<n>", () => {
  it("forwards the pool's upgrade unchanged to worker container n and returns its WebSocket", async () => {
    const res = await call("/_worker/1", { headers: { ...UPGRADE, "x-custom": "kept" } }, POOL);
    expect(res.status).toBe(101);
    const ws = res.webSocket!;
    expect(ws).toBeTruthy();
    const first = nextMessage(ws);
    ws.accept();
    const echo = JSON.parse((await first) as string) as Echo;
    expect(echo.instance).toBe("worker-1");
    expect(echo.method).toBe("GET");
    expect(echo.path).toBe("/_worker/1");
    // The tunnel in the container checks the token again: it must arrive as sent.
    expect(echo.headers.authorization).toBe(`Bearer ${WT}`);
    expect(echo.headers.upgrade).toBe("websocket");
    expect(echo.headers["x-custom"]).toBe("kept");
    // Binary messages cross both ways as they are.
    const bytes = new Uint8Array([0x50, 0x52, 0x49, 0, 255, 4]);
    const back = nextMessage(ws);
    ws.send(bytes);
    const got = await back;
    expect(got).toBeInstanceOf(ArrayBuffer);
    expect(new Uint8Array(got as ArrayBuffer)).toEqual(bytes);
    ws.close(1000, "done");
  });

  it("reaches worker 0 too, and accepts every token of a rotated list", async () => {
    for (const token of [WT, WT_NEXT]) {
      const res = await call("/_worker/0", { headers: { ...UPGRADE, authorization: `Bearer ${token}` } }, { ...POOL, SKIFF_WORKER_TOKEN: `${WT_NEXT},${WT}` });
      expect(res.status, token).toBe(101);
      const ws = res.webSocket!;
      const first = nextMessage(ws);
      ws.accept();
      expect((JSON.parse((await first) as string) as Echo).instance).toBe("worker-0");
      ws.close(1000, "done");
    }
  });

  it("refuses a missing or wrong token, and a client's API_TOKEN, before touching a container", async () => {
    for (const authorization of [undefined, "Bearer wrong", `Bearer ${WT.slice(0, -1)}`, `Bearer ${WT}x`, `Basic ${WT}`, WT, "Bearer token-new", "Bearer token-old"]) {
      const { bindings, touched } = tripwires();
      const headers: Record<string, string> = { upgrade: "websocket" };
      if (authorization !== undefined) headers.authorization = authorization;
      const res = await call("/_worker/0", { headers }, { ...POOL, ...bindings });
      expect(res.status, authorization).toBe(401);
      expect(res.headers.get("www-authenticate")).toMatch(/^Bearer/);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("unauthorized");
      expect(touched).toEqual([]);
    }
  });

  it("the pool's token does not open the query routes", async () => {
    for (const path of ["/query", "/metrics", "/_health?deep=1", "/api/v1/accounts/acc123/basin-sql/query/my-bucket"]) {
      const { bindings, touched } = tripwires();
      const res = await call(path, { method: path.includes("query") ? "POST" : "GET", headers: { authorization: `Bearer ${WT}` } }, { ...POOL, ...bindings });
      expect(res.status, path).toBe(401);
      expect(touched).toEqual([]);
    }
  });

  it.each(["/_worker/2", "/_worker/3", "/_worker/-1", "/_worker/01", "/_worker/1.0", "/_worker/x", "/_worker", "/_worker/", "/_worker/0/extra", "/_worker/99999999999"])(
    "%s is a 404 for a pool of 2, without touching a container",
    async (path) => {
      const { bindings, touched } = tripwires();
      const res = await call(path, { headers: UPGRADE }, { ...POOL, ...bindings });
      expect(res.status).toBe(404);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("not_found");
      expect(touched).toEqual([]);
    },
  );

  it("answers 426 to a request that is not a WebSocket upgrade, without touching a container", async () => {
    for (const init of [
      { headers: { authorization: `Bearer ${WT}` } },
      { headers: { authorization: `Bearer ${WT}`, upgrade: "h2c" } },
      { method: "POST", headers: UPGRADE, body: "x" },
    ] as RequestInit[]) {
      const { bindings, touched } = tripwires();
      const res = await call("/_worker/0", init, { ...POOL, ...bindings });
      expect(res.status).toBe(426);
      expect(res.headers.get("upgrade")).toBe("websocket");
      expect(touched).toEqual([]);
    }
  });

  it("does not exist without a pool, whatever the token", async () => {
    for (const pool of [undefined, "", "0"]) {
      const { bindings, touched } = tripwires();
      const res = await call("/_worker/0", { headers: UPGRADE }, { SKIFF_WORKER_TOKEN: WT, SKIFF_WORKER_POOL: pool, ...bindings });
      expect(res.status, String(pool)).toBe(404);
      expect(touched).toEqual([]);
    }
    expect(routeOf("/_worker/0")).toBe("worker");
    expect(routeOf("/_workers")).toBeNull();
  });

  it("maps a worker container that cannot start to 503 with Retry-After; the tunnel's own refusal passes through", async () => {
    for (const [mode, cause] of [
      ["fail-start", "could not start"],
      ["no-instance", "no container instance is free"],
      ["throw", "durable object broke"],
      ["restarting", "restarting to take new settings"],
    ]) {
      const res = await call("/_worker/0", { headers: { ...UPGRADE, "x-stand-in": mode! } }, POOL);
      expect(res.status, mode).toBe(503);
      expect(res.headers.get("retry-after")).toBeTruthy();
      expect(((await res.json()) as { error: { message: string } }).error.message).toContain(cause);
    }
    const res = await call("/_worker/0", { headers: { ...UPGRADE, "x-stand-in": "tunnel-401" } }, POOL);
    expect(res.status).toBe(401);
    expect(await res.json()).toEqual({ error: "unauthorized" });
  });

  it("a coordinator restarting for a new pool answers 503 on the query routes too", async () => {
    const res = await call("/query", { method: "POST", headers: { authorization: "Bearer token-new", "x-stand-in": "restarting" } });
    expect(res.status).toBe(503);
    expect(((await res.json()) as { error: { code: string; message: string } }).error.message).toContain("restarting");
  });

  it("bearerMatches needs an exact token of the list", async () => {
    expect(await bearerMatches(`Bearer ${WT}`, [WT])).toBe(true);
    expect(await bearerMatches(`bearer ${WT}`, ["other", WT])).toBe(true);
    expect(await bearerMatches(`Bearer ${WT}`, [])).toBe(false);
    expect(await bearerMatches(`Bearer ${WT}`, [""])).toBe(false);
    expect(await bearerMatches("Bearer ", [""])).toBe(false);
    expect(await bearerMatches(null, [WT])).toBe(false);
  });
});

describe("pool configuration", () => {
  it("is answered with its cause when a pool lacks what it needs, without waking a container", async () => {
    for (const [override, cause] of [
      [{ SKIFF_PUBLIC_URL: undefined }, "SKIFF_PUBLIC_URL is not set"],
      [{ SKIFF_PUBLIC_URL: " " }, "SKIFF_PUBLIC_URL is not set"],
      [{ SKIFF_PUBLIC_URL: "skiff.example.com" }, "is not a URL"],
      [{ SKIFF_PUBLIC_URL: "ftp://skiff.example.com" }, "is not http(s)"],
      [{ SKIFF_PUBLIC_URL: "https://skiff.example.com/base" }, "the Worker's origin only"],
      [{ SKIFF_PUBLIC_URL: "https://skiff.example.com/?x=1" }, "the Worker's origin only"],
      [{ SKIFF_PUBLIC_URL: "https://u:p@skiff.example.com" }, "the Worker's origin only"],
      [{ SKIFF_WORKER_TOKEN: undefined }, "SKIFF_WORKER_TOKEN is not set"],
      [{ SKIFF_WORKER_TOKEN: " , " }, "SKIFF_WORKER_TOKEN is not set"],
      [{ SKIFF_WORKER_TOKEN: "short" }, "at least 32 characters"],
      [{ SKIFF_WORKER_TOKEN: `${WT},short` }, "at least 32 characters"],
      [{ API_TOKEN: `token-new,${WT}` }, "must differ from every API_TOKEN"],
      [{ SKIFF_WORKER_POOL: "abc" }, "SKIFF_WORKER_POOL abc is not a number"],
      [{ SKIFF_WORKER_POOL: "-1" }, "is not a number"],
      [{ SKIFF_WORKER_POOL: "1.5" }, "is not a number"],
    ] as [Partial<Env>, string][]) {
      const { bindings, touched } = tripwires();
      const e = { ...POOL, ...override, ...bindings };
      for (const [path, init] of [
        ["/query", { method: "POST", headers: { authorization: "Bearer token-new" } }],
        ["/_worker/0", { headers: UPGRADE }],
      ] as [string, RequestInit][]) {
        const res = await call(path, init, e);
        expect(res.status, `${cause} on ${path}`).toBe(500);
        const body = (await res.json()) as { error: { code: string; message: string } };
        expect(body.error.code).toBe("not_configured");
        expect(body.error.message).toContain(cause);
        // No secret in the answer.
        expect(body.error.message).not.toContain(WT);
      }
      const health = await call("/_health", {}, e);
      expect(health.status).toBe(500);
      expect(((await health.json()) as { problem: string }).problem).toContain(cause);
      expect(touched).toEqual([]);
    }
  });

  it("a pool without its Durable Object binding is a configuration error", () => {
    expect(configProblem({ ...testEnv, ...POOL, SKIFF_WORKER: undefined })).toContain("SKIFF_WORKER Durable Object binding");
  });

  it("a complete pool, or none, is fine", async () => {
    expect(configProblem({ ...testEnv, ...POOL })).toBeNull();
    expect(configProblem({ ...testEnv, ...POOL, SKIFF_PUBLIC_URL: "http://127.0.0.1:8787/" })).toBeNull();
    expect(configProblem({ ...testEnv, ...POOL, SKIFF_WORKER_TOKEN: `${WT_NEXT}, ${WT}` })).toBeNull();
    // No pool: nothing else is needed, and nothing changes for queries.
    for (const pool of [undefined, "", "0", " 0 "]) {
      expect(configProblem({ ...testEnv, SKIFF_WORKER_POOL: pool, SKIFF_PUBLIC_URL: undefined, SKIFF_WORKER_TOKEN: undefined }), String(pool)).toBeNull();
    }
    const res = await call("/query", { method: "POST", headers: { authorization: "Bearer token-new" }, body: "{}" }, POOL);
    expect(res.status).toBe(200);
    expect(((await res.json()) as Echo).instance).toBe("skiff");
  });

  it("workerPoolSize and workerUrls", () => {
    expect([undefined, "", " ", "0", "3", " 12 ", "x", "-1", "2.5"].map(workerPoolSize)).toEqual([0, 0, 0, 0, 3, 12, null, null, null]);
    expect(workerUrls("https://skiff.example.com", 3)).toEqual([
      "wss://skiff.example.com/_worker/0",
      "wss://skiff.example.com/_worker/1",
      "wss://skiff.example.com/_worker/2",
    ]);
    expect(workerUrls("http://127.0.0.1:8787/", 1)).toEqual(["ws://127.0.0.1:8787/_worker/0"]);
    expect(workerUrls("https://skiff.example.com:8443", 1)).toEqual(["wss://skiff.example.com:8443/_worker/0"]);
    expect(distribution({ ...testEnv, SKIFF_WORKER_POOL: "0", SKIFF_WORKER_TOKEN: WT })).toBeNull();
  });
});

describe("container environments with a pool", () => {
  const creds = { query: "internal-query", admin: "internal-admin" };
  const settings: Partial<Env> = {
    SKIFF_CATALOG_URI: "https://catalog.example/acc/b",
    SKIFF_WAREHOUSE: "acc_b",
    LAKE_VERSIONS: "events=1,2",
    API_TOKEN: "t1,t2",
    CF_API_TOKEN: "cf",
    SKIFF_CATALOG_TOKEN: "catalog-token",
    SKIFF_MEMORY_LIMIT: "2GiB",
    RUST_LOG: "info",
    SKIFF_INSTANCES: "3",
    SKIFF_HTTP_ADDR: "127.0.0.1:1",
    SKIFF_API_TOKEN: "nope",
    SKIFF_ADMIN_TOKEN: "nope",
    // A var must not point the coordinator (and the pool's token) somewhere else.
    SKIFF_WORKERS: "https://elsewhere.example/_worker/0",
    SKIFF_WORKER_ADDR: "0.0.0.0:1",
    SKIFF_WORKER_TUNNEL_ADDR: "0.0.0.0:2",
  };

  it("the coordinator gets the pool's tunnel URLs and token", () => {
    const vars = containerEnvVars({ ...testEnv, ...settings, ...POOL, SKIFF_WORKER_POOL: "3" } as Env, creds);
    expect(vars.SKIFF_WORKERS).toBe("wss://skiff.example.com/_worker/0,wss://skiff.example.com/_worker/1,wss://skiff.example.com/_worker/2");
    expect(vars.SKIFF_WORKER_TOKEN).toBe(WT);
    for (const k of ["SKIFF_WORKER_POOL", "SKIFF_PUBLIC_URL", "SKIFF_WORKER_ADDR", "SKIFF_WORKER_TUNNEL_ADDR", "SKIFF_INSTANCES"]) expect(vars[k], k).toBeUndefined();
    expect(vars.API_TOKEN).toBe("internal-query");
    expect(vars.SKIFF_HTTP_ADDR).toBe("0.0.0.0:8080");
    // ws:// for a local (http) Worker; the list, as set, for rotation (skiff sends the first).
    const local = containerEnvVars({ ...testEnv, ...POOL, SKIFF_PUBLIC_URL: "http://127.0.0.1:8787", SKIFF_WORKER_TOKEN: `${WT_NEXT},${WT}` } as Env, creds);
    expect(local.SKIFF_WORKERS).toBe("ws://127.0.0.1:8787/_worker/0,ws://127.0.0.1:8787/_worker/1");
    expect(local.SKIFF_WORKER_TOKEN).toBe(`${WT_NEXT},${WT}`);
  });

  it("without a pool the coordinator gets no workers and no pool token, even if vars name them", () => {
    for (const pool of [undefined, "0"]) {
      const vars = containerEnvVars({ ...testEnv, ...settings, SKIFF_WORKER_POOL: pool, SKIFF_WORKER_TOKEN: WT, SKIFF_PUBLIC_URL: "https://skiff.example.com" } as Env, creds);
      expect(vars.SKIFF_WORKERS).toBeUndefined();
      expect(vars.SKIFF_WORKER_TOKEN).toBeUndefined();
      expect(vars.SKIFF_PUBLIC_URL).toBeUndefined();
    }
  });

  it("a worker container runs `skiff worker` with the shared settings, its listeners and the pool's token, and no client or catalog token", () => {
    const vars = workerEnvVars({ ...testEnv, ...settings, ...POOL } as Env);
    expect(vars).toEqual({
      SKIFF_LOG_FORMAT: "json",
      SKIFF_CATALOG_URI: "https://catalog.example/acc/b",
      SKIFF_WAREHOUSE: "acc_b",
      LAKE_VERSIONS: "events=1,2",
      SKIFF_MEMORY_LIMIT: "2GiB",
      RUST_LOG: "info",
      SKIFF_WORKER_ADDR: "127.0.0.1:50051",
      SKIFF_WORKER_TUNNEL_ADDR: "0.0.0.0:8080",
      SKIFF_WORKER_TOKEN: WT,
    });
    expect(workerEnvVars({ ...testEnv, ...POOL, SKIFF_LOG_FORMAT: "text" } as Env).SKIFF_LOG_FORMAT).toBe("text");
    expect(() => workerEnvVars({ ...testEnv, ...POOL, SKIFF_WORKER_TOKEN: "" } as Env)).toThrow(/SKIFF_WORKER_TOKEN is not set/);
    expect(WORKER_ENTRYPOINT).toEqual(["/usr/local/bin/skiff", "worker"]);
  });

  it("the pool's settings are the Worker's, or set by the classes", () => {
    for (const k of ["SKIFF_WORKER_POOL", "SKIFF_PUBLIC_URL"]) expect(WORKER_ONLY.has(k), k).toBe(true);
    for (const k of ["SKIFF_WORKERS", "SKIFF_WORKER_TOKEN", "SKIFF_WORKER_ADDR", "SKIFF_WORKER_TUNNEL_ADDR"]) expect(SET_BY_CONTAINER.has(k), k).toBe(true);
  });
});
