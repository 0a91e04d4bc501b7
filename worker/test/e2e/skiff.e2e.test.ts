// End-to-end: real queries through the Worker's fetch handler (in workerd) to a real skiff.
// Needs SKIFF_URL (e.g. http://127.0.0.1:8080) and SKIFF_TEST_TOKEN; fails without them.
import { env } from "cloudflare:workers";
import { beforeEach, describe, expect, it } from "vitest";
import worker from "../../src/index";
import type { Env } from "../../src/index";

const e = env as unknown as Env & { SKIFF_URL: string; SKIFF_TEST_TOKEN: string };
const WORKER = "https://skiff-worker.example.com";
const BASIN = "/api/v1/accounts/acc123/basin-sql/query/bucket";

function viaWorker(path: string, init: RequestInit): Promise<Response> {
  return worker.fetch(new Request(WORKER + path, init), e);
}

function direct(path: string, init: RequestInit): Promise<Response> {
  return fetch(new URL(path, e.SKIFF_URL), init);
}

function post(body: unknown, token = e.SKIFF_TEST_TOKEN): RequestInit {
  return {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  };
}

describe("Worker -> real skiff", () => {
  beforeEach(() => {
    // Fail, not skip: a missing skiff must not look like a green run.
    if (!e.SKIFF_URL || !e.SKIFF_TEST_TOKEN) {
      throw new Error("set SKIFF_URL (e.g. http://127.0.0.1:8080) and SKIFF_TEST_TOKEN to run the e2e tests");
    }
  });

  it("skiff is up", async () => {
    const res = await direct("/_health", {});
    expect(res.status).toBe(200);
    await res.body?.cancel();
  });

  it("/query returns skiff's answer unchanged", async () => {
    const q = { query: "SELECT 1 AS one" };
    const [w, d] = await Promise.all([viaWorker("/query", post(q)), direct("/query", post(q))]);
    expect(w.status).toBe(200);
    expect(w.headers.get("x-e2e-via")).toBe("local-skiff");
    expect(w.headers.get("content-type")).toBe(d.headers.get("content-type"));
    const [wt, dt] = await Promise.all([w.text(), d.text()]);
    expect(wt).toBe(dt);
    expect(JSON.parse(wt)).toEqual([{ one: 1 }]);
    expect(w.headers.get("x-request-id")).toBeTruthy();
  });

  it("/streaming-query returns the same Arrow bytes as skiff", async () => {
    const q = { query: "SELECT 1 AS one" };
    const [w, d] = await Promise.all([viaWorker("/streaming-query", post(q)), direct("/streaming-query", post(q))]);
    expect(w.status).toBe(200);
    expect(w.headers.get("content-type")).toBe("application/vnd.apache.arrow.stream");
    expect(d.headers.get("content-type")).toBe("application/vnd.apache.arrow.stream");
    const [wb, db] = await Promise.all([w.arrayBuffer(), d.arrayBuffer()]);
    expect(wb.byteLength).toBeGreaterThan(0);
    expect(new Uint8Array(wb)).toEqual(new Uint8Array(db));
  });

  it("a wrong token gets 401 from the Worker", async () => {
    const res = await viaWorker("/query", post({ query: "SELECT 1 AS one" }, "wrong-token"));
    expect(res.status).toBe(401);
    expect(res.headers.get("x-e2e-via")).toBeNull(); // never reached skiff
    expect(res.headers.get("www-authenticate")).toMatch(/^Bearer/);
    expect(await res.json()).toEqual({ error: { code: "unauthorized", message: "missing or invalid bearer token" } });
  });

  it("the Basin SQL route answers a success envelope", async () => {
    const res = await viaWorker(BASIN, post({ query: "SELECT 1 AS one" }));
    expect(res.status).toBe(200);
    const body = (await res.json()) as { success: boolean; errors: unknown[]; result: { rows: unknown[] } };
    expect(body.success).toBe(true);
    expect(body.errors).toEqual([]);
    expect(body.result.rows).toEqual([{ one: 1 }]);
  });

  it("/_health is the Worker's own: no token, skiff never reached", async () => {
    const res = await viaWorker("/_health", {});
    expect(res.status).toBe(200);
    expect(res.headers.get("x-e2e-via")).toBeNull();
    expect(await res.json()).toEqual({ status: "ok" });
  });
});
