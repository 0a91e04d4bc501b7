// Unit tests of the Worker's fetch handler in workerd. SKIFF is bound to a stand-in Durable
// Object (see stand-in.ts): Cloudflare's container runtime cannot run here.
import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import worker, { authorized, configProblem, fnv1a32, instanceName, poolSize, routeOf } from "../../src/index";
import type { Env } from "../../src/index";
import { SET_BY_CONTAINER, WORKER_ONLY, catalogToken, containerEnvVars, containerFailure } from "../../src/container";
import { CHUNK_1, CHUNK_2, type Echo } from "./stand-in";

const testEnv = env as unknown as Env;
const BASIN = "/api/v1/accounts/acc123/basin-sql/query/my-bucket";
const R2 = "/api/v1/accounts/acc123/r2-sql/query/my-bucket";
const GOOD = { authorization: "Bearer token-new" };

function call(path: string, init: RequestInit = {}, envOverride: Partial<Env> = {}): Promise<Response> {
  return worker.fetch(new Request(`https://skiff.example.com${path}`, init), { ...testEnv, ...envOverride });
}

/** A SKIFF binding that records any use: proves the container was never touched. */
function tripwire(): { binding: Env["SKIFF"]; touched: string[] } {
  const touched: string[] = [];
  const binding = new Proxy(
    {},
    {
      get(_target, prop) {
        touched.push(String(prop));
        throw new Error("container touched");
      },
    },
  ) as unknown as Env["SKIFF"];
  return { binding, touched };
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([
    p,
    new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`timed out: ${what}`)), ms)),
  ]);
}

describe("auth", () => {
  it("rejects a request without a token, before touching the container", async () => {
    const { binding, touched } = tripwire();
    const res = await call("/query", { method: "POST", body: "{}" }, { SKIFF: binding });
    expect(res.status).toBe(401);
    expect(res.headers.get("www-authenticate")).toMatch(/^Bearer/);
    expect(res.headers.get("content-type")).toMatch(/application\/json/);
    expect(await res.json()).toEqual({ error: { code: "unauthorized", message: "missing or invalid bearer token" } });
    expect(touched).toEqual([]);
  });

  it("rejects a wrong token (and near misses) before touching the container", async () => {
    for (const authorization of ["Bearer wrong", "Bearer token-ne", "Bearer token-new2", "Basic token-new", "token-new", "Bearer "]) {
      const { binding, touched } = tripwire();
      const res = await call("/query", { method: "POST", headers: { authorization } }, { SKIFF: binding });
      expect(res.status, authorization).toBe(401);
      expect(touched).toEqual([]);
    }
  });

  it("the tripwire does catch a request that gets through", async () => {
    const { binding, touched } = tripwire();
    const res = await call("/query", { method: "POST", headers: GOOD }, { SKIFF: binding });
    expect(res.status).toBeGreaterThanOrEqual(500);
    expect(touched.length).toBeGreaterThan(0);
  });

  it("accepts the right token, case-insensitive scheme", async () => {
    const res = await call("/query", { method: "POST", headers: { authorization: "bearer token-new" }, body: "{}" });
    expect(res.status).toBe(200);
  });

  it("accepts every token of a rotated list", async () => {
    for (const t of ["token-new", "token-old"]) {
      const res = await call("/metrics", { headers: { authorization: `Bearer ${t}` } });
      expect(res.status, t).toBe(200);
    }
    const res = await call("/metrics", { headers: { authorization: "Bearer token-old" } }, { API_TOKEN: "token-newer" });
    expect(res.status).toBe(401);
  });

  it("answers 401 in the Basin envelope on Basin routes", async () => {
    for (const path of [BASIN, R2]) {
      const { binding, touched } = tripwire();
      const res = await call(path, { method: "POST", headers: { authorization: "Bearer nope" } }, { SKIFF: binding });
      expect(res.status).toBe(401);
      expect(res.headers.get("www-authenticate")).toMatch(/^Bearer/);
      const body = await res.json();
      expect(body).toEqual({
        success: false,
        errors: [{ code: 10000, message: "missing or invalid bearer token" }],
        messages: [],
        result: null,
      });
      expect(touched).toEqual([]);
    }
  });

  it("answers /_health itself: no token needed, and the container is never touched", async () => {
    const { binding, touched } = tripwire();
    const res = await call("/_health", {}, { SKIFF: binding });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ status: "ok" });
    expect(touched).toEqual([]);
  });

  it("refuses a deep /_health without a token, before touching the container", async () => {
    for (const headers of [{}, { authorization: "Bearer wrong" }] as Record<string, string>[]) {
      const { binding, touched } = tripwire();
      const res = await call("/_health?deep=1", { headers }, { SKIFF: binding });
      expect(res.status).toBe(401);
      expect(touched).toEqual([]);
    }
  });

  it("answers an authenticated deep /_health with the instance's report", async () => {
    const res = await call("/_health?deep=1", { headers: GOOD });
    expect(res.status).toBe(200);
    const body = (await res.json()) as Record<string, unknown>;
    expect(body).toMatchObject({ status: "sleeping", instance: "skiff", running: false, lastError: null, skiff: null });
    expect((body.state as { status: string }).status).toBe("stopped");
  });

  it("fails closed when API_TOKEN is not set", async () => {
    expect(await authorized("Bearer x", undefined)).toBe(false);
    expect(await authorized("Bearer x", " , ")).toBe(false);
    expect(await authorized("Bearer b", "a,b")).toBe(true);
    const { binding, touched } = tripwire();
    const res = await call("/query", { method: "POST", headers: GOOD }, { API_TOKEN: "", SKIFF: binding });
    expect(res.status).toBe(500);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("not_configured");
    expect(touched).toEqual([]);
  });
});

describe("routing", () => {
  it.each([
    ["GET", "/"],
    ["POST", "/query"],
    ["POST", "/streaming-query"],
    ["GET", "/metrics"],
    ["POST", BASIN],
    ["POST", R2],
  ])("%s %s reaches the container", async (method, path) => {
    const res = await call(path, { method, headers: GOOD, body: method === "POST" ? '{"query":"SELECT 1"}' : undefined });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-from")).toBe("stand-in");
    const echo = (await res.json()) as Echo;
    expect(echo.path).toBe(path);
    expect(echo.method).toBe(method);
  });

  it.each(["/nope", "/query/extra", "/api/v1/accounts/a/basin-sql/query/", "/api/v1/accounts/a/x/basin-sql/query/b", "/api/v1/accounts/a/d1/query/b"])(
    "%s is a 404 from the Worker",
    async (path) => {
      const { binding, touched } = tripwire();
      const res = await call(path, { headers: GOOD }, { SKIFF: binding });
      expect(res.status).toBe(404);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("not_found");
      expect(touched).toEqual([]);
    },
  );

  it("routeOf classifies paths", () => {
    expect(routeOf("/_health")).toBe("health");
    expect(routeOf("/query")).toBe("skiff");
    expect(routeOf(BASIN)).toBe("basin");
    expect(routeOf(R2)).toBe("basin");
    expect(routeOf("/favicon.ico")).toBeNull();
  });
});

describe("pass-through", () => {
  it("forwards method, body bytes, content type, query string and the client's headers", async () => {
    const bytes = new Uint8Array(256).map((_, i) => i);
    const res = await call("/query?format=json", {
      method: "POST",
      headers: { ...GOOD, "content-type": "application/octet-stream", "x-custom": "kept" },
      body: bytes,
    });
    const echo = (await res.json()) as Echo;
    expect(echo.method).toBe("POST");
    expect(echo.path).toBe("/query?format=json");
    expect(echo.headers["content-type"]).toBe("application/octet-stream");
    expect(echo.headers["x-custom"]).toBe("kept");
    expect(Uint8Array.from(atob(echo.body), (c) => c.charCodeAt(0))).toEqual(bytes);
  });

  it("drops a client's cf-container-target-port (it would pick another container port)", async () => {
    const res = await call("/query", { method: "POST", headers: { ...GOOD, "cf-container-target-port": "9000" } });
    expect(((await res.json()) as Echo).headers["cf-container-target-port"]).toBeUndefined();
  });

  it("forwards a streamed request body", async () => {
    const enc = new TextEncoder();
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(enc.encode('{"query":'));
        c.enqueue(enc.encode('"SELECT 1"}'));
        c.close();
      },
    });
    const res = await call("/query", { method: "POST", headers: { ...GOOD, "content-type": "application/json" }, body });
    const echo = (await res.json()) as Echo;
    expect(atob(echo.body)).toBe('{"query":"SELECT 1"}');
  });

  it("adds a request id to the forwarded request and the response", async () => {
    const res = await call("/query", { method: "POST", headers: GOOD });
    const id = res.headers.get("x-request-id");
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    expect(((await res.json()) as Echo).headers["x-request-id"]).toBe(id);
  });

  it("keeps a sane client request id and replaces an insane one", async () => {
    let res = await call("/query", { method: "POST", headers: { ...GOOD, "x-request-id": "client-abc.123:4" } });
    expect(res.headers.get("x-request-id")).toBe("client-abc.123:4");
    expect(((await res.json()) as Echo).headers["x-request-id"]).toBe("client-abc.123:4");

    for (const bad of ["has space", "x".repeat(129), "<script>"]) {
      res = await call("/query", { method: "POST", headers: { ...GOOD, "x-request-id": bad } });
      const id = res.headers.get("x-request-id");
      expect(id).not.toBe(bad);
      expect(id).toMatch(/^[0-9a-f-]{36}$/);
    }
  });

  it("puts the request id on the Worker's own errors too", async () => {
    const res = await call("/query", { method: "POST", headers: { "x-request-id": "r-1" } });
    expect(res.status).toBe(401);
    expect(res.headers.get("x-request-id")).toBe("r-1");
  });

  it("passes skiff's own errors through unchanged", async () => {
    let res = await call("/query", { method: "POST", headers: { ...GOOD, "x-stand-in": "skiff-500" } });
    expect(res.status).toBe(500);
    expect(await res.json()).toEqual({ error: { code: "internal", message: "boom" } });
    res = await call("/query", { method: "POST", headers: { ...GOOD, "x-stand-in": "text-500" } });
    expect(res.status).toBe(500);
    expect(await res.text()).toBe("some other plain failure");
  });

  it("works through the Worker's real entry point too", async () => {
    const res = await exports.default.fetch("https://skiff.example.com/query", { method: "POST", headers: GOOD, body: "{}" });
    expect(res.status).toBe(200);
    expect(((await res.json()) as Echo).instance).toBe("skiff");
  });
});

describe("streaming", () => {
  it("delivers a chunked response chunk by chunk, not buffered", async () => {
    const res = await withTimeout(
      call("/streaming-query", { method: "POST", headers: { ...GOOD, "x-stand-in": "stream" } }),
      3000,
      "response head (is the Worker buffering the body?)",
    );
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("application/vnd.apache.arrow.stream");
    const reader = res.body!.getReader();
    const dec = new TextDecoder();

    // Chunk 2 is only sent after we ask for it, so reading chunk 1 first proves nothing waits
    // for the whole body. A buffering Worker would hang here until the timeout.
    const first = await withTimeout(reader.read(), 3000, "first chunk");
    expect(dec.decode(first.value)).toBe(CHUNK_1);

    const release = await testEnv.SKIFF.getByName("skiff").fetch("https://stand-in/__release");
    expect(await release.text()).toBe("released");

    let rest = "";
    for (;;) {
      const { done, value } = await withTimeout(reader.read(), 3000, "second chunk");
      if (done) break;
      rest += dec.decode(value, { stream: true });
    }
    expect(rest).toBe(CHUNK_2);
  });
});

describe("container failures", () => {
  it.each([
    ["fail-start", "/query", "could not start (the container exited with code 1)"],
    ["no-instance", "/query", "no container instance is free"],
    ["disconnected", "/query", "connection to skiff's container was lost"],
    ["throw", "/query", "durable object broke"],
  ])("%s on %s answers 503 with Retry-After and the cause", async (mode, path, cause) => {
    const res = await call(path, { method: "POST", headers: { ...GOOD, "x-stand-in": mode } });
    expect(res.status).toBe(503);
    expect(Number(res.headers.get("retry-after"))).toBeGreaterThan(0);
    expect(res.headers.get("x-request-id")).toBeTruthy();
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("unavailable");
    expect(body.error.message).toContain(cause);
  });

  it.each(["fail-start", "no-instance", "disconnected", "throw"])("%s on a Basin route answers the envelope with 80001", async (mode) => {
    const res = await call(BASIN, { method: "POST", headers: { ...GOOD, "x-stand-in": mode } });
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBeTruthy();
    const body = (await res.json()) as { success: boolean; errors: { code: number }[]; result: unknown };
    expect(body.success).toBe(false);
    expect(body.errors[0]!.code).toBe(80001);
    expect(body.result).toBeNull();
  });

  it("maps the library's text/plain 429 to 429 in both shapes", async () => {
    let res = await call("/query", { method: "POST", headers: { ...GOOD, "x-stand-in": "rate-limited" } });
    expect(res.status).toBe(429);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("overloaded");
    res = await call(BASIN, { method: "POST", headers: { ...GOOD, "x-stand-in": "rate-limited" } });
    expect(res.status).toBe(429);
    const body = (await res.json()) as { success: boolean; errors: { code: number }[] };
    expect(body.success).toBe(false);
    expect(body.errors[0]!.code).toBe(42900);
  });

  it("containerFailure only matches the container library's own answers", async () => {
    const kind = async (r: Response) => (await containerFailure(r))?.kind ?? null;
    expect(await kind(new Response("Failed to start container: x", { status: 500 }))).toBe("start_failed");
    expect(await kind(new Response("Container suddenly disconnected, try again", { status: 500 }))).toBe("connection_lost");
    expect(await kind(new Response("Error proxying request to container: x", { status: 500 }))).toBe("connection_lost");
    expect(await kind(new Response("There is no Container instance available at this time.", { status: 503 }))).toBe("no_instance");
    expect(await kind(new Response("you are requesting too many containers per second", { status: 429 }))).toBe("rate_limited");
    expect(await kind(new Response("Failed to start container: x", { status: 200 }))).toBeNull();
    expect(await kind(new Response("Failed to start container: x", { status: 503 }))).toBeNull();
    expect(await kind(Response.json({ error: "Failed to start container" }, { status: 500 }))).toBeNull();
    // skiff's own 429 (JSON) passes through.
    expect(await kind(Response.json({ error: { code: "overloaded" } }, { status: 429 }))).toBeNull();
  });
});

describe("configuration", () => {
  it("a missing catalog is answered with its cause, without waking a container", async () => {
    for (const [override, cause] of [
      [{ SKIFF_CATALOG_URI: "" }, "SKIFF_CATALOG_URI is not set"],
      [{ SKIFF_CATALOG_URI: undefined }, "SKIFF_CATALOG_URI is not set"],
      [{ SKIFF_CATALOG_URI: "https://catalog.cloudflarestorage.com/<ACCOUNT_ID>/<BUCKET>" }, "placeholder"],
      [{ SKIFF_WAREHOUSE: "<ACCOUNT_ID>_<BUCKET>" }, "SKIFF_WAREHOUSE still holds a placeholder"],
      [{ CF_API_TOKEN: "" }, "CF_API_TOKEN is not set"],
      [{ API_TOKEN: "" }, "API_TOKEN is not set"],
      [{ SKIFF_LOCATION_HINT: "mars" }, "not a location hint"],
    ] as [Partial<Env>, string][]) {
      const { binding, touched } = tripwire();
      const res = await call("/query", { method: "POST", headers: GOOD }, { ...override, SKIFF: binding });
      expect(res.status, cause).toBe(500);
      const body = (await res.json()) as { error: { code: string; message: string } };
      expect(body.error.code).toBe("not_configured");
      expect(body.error.message).toContain(cause);
      expect(touched).toEqual([]);
      // The Worker's own health says so too.
      const health = await call("/_health", {}, { ...override, SKIFF: binding });
      expect(health.status).toBe(500);
      expect(((await health.json()) as { status: string; problem: string }).problem).toContain(cause);
      const basin = await call(BASIN, { method: "POST", headers: GOOD }, { ...override, SKIFF: binding });
      expect(((await basin.json()) as { errors: { code: number; message: string }[] }).errors[0]!.message).toContain(cause);
    }
  });

  it("a SQL catalog needs no catalog token; SKIFF_CATALOG_TOKEN stands for CF_API_TOKEN", () => {
    const base = { ...testEnv, CF_API_TOKEN: "" };
    expect(configProblem({ ...base, SKIFF_CATALOG_URI: "sqlite:///lake/catalog.db" })).toBeNull();
    expect(configProblem({ ...base, SKIFF_CATALOG_TOKEN: "t" })).toBeNull();
    expect(catalogToken({ ...base, SKIFF_CATALOG_TOKEN: "a", CF_API_TOKEN: "b" })).toBe("a");
    expect(catalogToken({ ...base, CF_API_TOKEN: "b" })).toBe("b");
  });

  it("a location hint places the instance", async () => {
    const res = await call("/query", { method: "POST", headers: GOOD }, { SKIFF_LOCATION_HINT: "weur" });
    expect(res.status).toBe(200);
  });
});

describe("instance choice", () => {
  const h = (v?: string, name = "x-project-id") => new Headers(v === undefined ? {} : { [name]: v });

  it("is one named instance by default", () => {
    expect(instanceName(h("p1"), {})).toBe("skiff");
    expect(instanceName(h("p1"), { SKIFF_INSTANCES: "1" })).toBe("skiff");
    for (const bad of ["0", "-2", "abc", "2.5", ""]) expect(instanceName(h("p1"), { SKIFF_INSTANCES: bad }), bad).toBe("skiff");
  });

  it("uses FNV-1a (known vectors)", () => {
    expect(fnv1a32("")).toBe(0x811c9dc5);
    expect(fnv1a32("a")).toBe(0xe40c292c);
    expect(fnv1a32("foobar")).toBe(0xbf9cf968);
  });

  it("picks a stable instance in a fixed pool", () => {
    const env4 = { SKIFF_INSTANCES: "4" };
    expect(poolSize("4")).toBe(4);
    expect(instanceName(h("project-42"), env4)).toBe(`skiff-${fnv1a32("project-42") % 4}`);
    expect(instanceName(h("project-42"), env4)).toBe(instanceName(h("project-42"), env4));
    const used = new Set<string>();
    for (let i = 0; i < 200; i++) used.add(instanceName(h(`project-${i}`), env4));
    expect([...used].sort()).toEqual(["skiff-0", "skiff-1", "skiff-2", "skiff-3"]);
  });

  it("sends requests without the header to instance 0, and honours SKIFF_SHARD_HEADER", () => {
    expect(instanceName(h(), { SKIFF_INSTANCES: "4" })).toBe("skiff-0");
    expect(instanceName(h(""), { SKIFF_INSTANCES: "4" })).toBe("skiff-0");
    const e = { SKIFF_INSTANCES: "8", SKIFF_SHARD_HEADER: "x-tenant" };
    expect(instanceName(h("t-9", "x-tenant"), e)).toBe(`skiff-${fnv1a32("t-9") % 8}`);
    expect(instanceName(h("t-9"), e)).toBe("skiff-0");
  });

  it("the handler forwards to the chosen named instance", async () => {
    const res = await call("/query", { method: "POST", headers: { ...GOOD, "x-project-id": "project-42" } }, { SKIFF_INSTANCES: "3" });
    expect(((await res.json()) as Echo).instance).toBe(`skiff-${fnv1a32("project-42") % 3}`);
    const res0 = await call("/query", { method: "POST", headers: GOOD }, { SKIFF_INSTANCES: "3" });
    expect(((await res0.json()) as Echo).instance).toBe("skiff-0");
  });
});

describe("container configuration", () => {
  const creds = { query: "internal-query", admin: "internal-admin" };

  it("passes settings and secrets as env vars; HTTP on 0.0.0.0:8080, Flight off, JSON logs, skiff's tokens its own", () => {
    const vars = containerEnvVars(
      {
        ...testEnv,
        SKIFF_CATALOG_URI: "https://catalog.example/acc/b",
        SKIFF_WAREHOUSE: "acc_b",
        LAKE_VERSIONS: "events=1,2",
        API_TOKEN: "t1,t2",
        CF_API_TOKEN: "cf",
        SKIFF_MEMORY_LIMIT: "2GiB",
        SKIFF_INSTANCES: "3",
        SKIFF_HTTP_ADDR: "127.0.0.1:1",
        SKIFF_API_TOKEN: "nope",
        SKIFF_ADMIN_TOKEN: "nope",
        SKIFF_LOG_SQL: "",
        OTHER: "not passed",
      },
      creds,
    );
    expect(vars).toEqual({
      SKIFF_LOG_FORMAT: "json",
      SKIFF_HTTP_ADDR: "0.0.0.0:8080",
      SKIFF_FLIGHT_ADDR: "off",
      SKIFF_CATALOG_URI: "https://catalog.example/acc/b",
      SKIFF_WAREHOUSE: "acc_b",
      LAKE_VERSIONS: "events=1,2",
      CF_API_TOKEN: "cf",
      SKIFF_MEMORY_LIMIT: "2GiB",
      API_TOKEN: "internal-query",
      SKIFF_ADMIN_TOKEN: "internal-admin",
    });
    expect(containerEnvVars({ ...testEnv, SKIFF_LOG_FORMAT: "text" }, creds).SKIFF_LOG_FORMAT).toBe("text");
  });

  it("every setting in src/config.rs can be set from a var or secret", () => {
    const settings = JSON.parse(testEnv.TEST_CONFIG_SETTINGS as string) as string[];
    // A sanity check that the list was read: the settings the issue names are in it.
    for (const k of ["SKIFF_MEMORY_LIMIT", "SKIFF_RESULT_CACHE_BYTES", "SKIFF_LOG_FORMAT", "SKIFF_CATALOG_TOKEN", "SKIFF_QUERY_TIMEOUT"]) {
      expect(settings, k).toContain(k);
    }
    const env: Partial<Env> = {};
    for (const k of settings) env[k] = `value-of-${k}`;
    const vars = containerEnvVars({ ...testEnv, ...env } as Env, creds);
    for (const k of settings) {
      if (SET_BY_CONTAINER.has(k) || WORKER_ONLY.has(k)) continue;
      expect(vars[k], k).toBe(`value-of-${k}`);
    }
    // What the containers set themselves is what the deployment needs, whatever the env says:
    // listeners, skiff's own tokens, and the worker pool (the tunnel's settings may not be in
    // config.rs yet; the pool's list is).
    expect(settings).toContain("SKIFF_WORKERS");
    const intended = [
      "API_TOKEN",
      "SKIFF_ADMIN_TOKEN",
      "SKIFF_FLIGHT_ADDR",
      "SKIFF_HTTP_ADDR",
      "SKIFF_WORKERS",
      "SKIFF_WORKER_ADDR",
      "SKIFF_WORKER_TUNNEL_ADDR",
      "SKIFF_WORKER_TOKEN",
    ];
    expect([...SET_BY_CONTAINER].filter((k) => settings.includes(k)).sort()).toEqual(intended.filter((k) => settings.includes(k)).sort());
  });
});
