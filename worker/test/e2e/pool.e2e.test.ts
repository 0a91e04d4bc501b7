// The worker pool end to end in workerd: the production Worker's `/_worker/<n>` route and the
// production SkiffWorkerContainer class, with the real `skiff worker` (SKIFF_BIN) behind them.
//
// What is a stand-in: only the container runtime. Cloudflare's (the Durable Object's
// `ctx.container`) needs Cloudflare or Docker, so fake-container.ts gives the class one whose
// process the LAUNCHER service (launcher.ts) starts on this machine: the class's entrypoint and
// environment as given, its port 8080 on a free local port. Everything above it is production
// code: the Worker's token check and routing, the class's start, readiness and restart, and
// @cloudflare/containers' WebSocket proxying in the Durable Object.
//
// Not covered here: a coordinator dialling the tunnel. Its `wss://` URL is the Worker's public
// host, which a process on this machine cannot reach in workerd's test pool; so the test plays
// the coordinator's part itself, sending HTTP/2's opening bytes through the WebSocket and reading
// the real worker's HTTP/2 server answer them.
import { env, runInDurableObject } from "cloudflare:test";
import { afterAll, describe, expect, it } from "vitest";
import worker from "../../src/index";
import type { Env } from "../../src/index";
import type { SkiffContainer } from "../../src/container";
import type { SkiffWorkerContainer } from "../../src/worker-container";

const e = env as unknown as Env & {
  SKIFF_CT: DurableObjectNamespace<SkiffContainer>;
  SKIFF_WORKER: DurableObjectNamespace<SkiffWorkerContainer>;
  LAUNCHER: Fetcher;
  SKIFF_TEST_TOKEN: string;
  SKIFF_WORKER_TOKEN: string;
};
const TOKEN = e.SKIFF_WORKER_TOKEN;
const NEXT_TOKEN = "e2e-worker-token-rotated-fedcba9876543210fedcba98";
/** One worker container, reached through a Worker at http://127.0.0.1:8787 (no process listens there: nothing dials it here). */
const POOL: Partial<Env> = { SKIFF_WORKER_POOL: "1", SKIFF_PUBLIC_URL: "http://127.0.0.1:8787" };

/** The Worker with a pool of one. */
function call(path: string, init: RequestInit = {}, override: Partial<Env> = {}): Promise<Response> {
  return worker.fetch(new Request(`https://skiff.example.com${path}`, init), { ...e, ...POOL, ...override });
}

function open(token: string, override: Partial<Env> = {}): Promise<Response> {
  return call("/_worker/0", { headers: { upgrade: "websocket", authorization: `Bearer ${token}` } }, override);
}

interface Info {
  starts: number;
  env: Record<string, string> | null;
  command: string[] | null;
  port: number | null;
  running: boolean;
  log: string[];
}

/** What the launcher started for a Durable Object: worker-0 by default. */
async function info(ns: { idFromName(name: string): DurableObjectId } = e.SKIFF_WORKER, name = "worker-0"): Promise<Info> {
  const id = ns.idFromName(name).toString();
  return (await (await e.LAUNCHER.fetch(`http://launcher/info?id=${id}`)).json()) as Info;
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

// HTTP/2's client connection preface, then an empty SETTINGS frame (length 0, type 4, flags 0, stream 0).
const PREFACE = new TextEncoder().encode("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
const EMPTY_SETTINGS = new Uint8Array([0, 0, 0, 4, 0, 0, 0, 0, 0]);

interface Frame {
  type: number;
  flags: number;
  stream: number;
  length: number;
}

/** The frames in `bytes`, as far as they are complete. */
function frames(bytes: Uint8Array): Frame[] {
  const out: Frame[] = [];
  for (let at = 0; at + 9 <= bytes.length; ) {
    const length = (bytes[at]! << 16) | (bytes[at + 1]! << 8) | bytes[at + 2]!;
    const stream = ((bytes[at + 5]! & 0x7f) << 24) | (bytes[at + 6]! << 16) | (bytes[at + 7]! << 8) | bytes[at + 8]!;
    if (at + 9 + length > bytes.length) break;
    out.push({ type: bytes[at + 3]!, flags: bytes[at + 4]!, stream, length });
    at += 9 + length;
  }
  return out;
}

/** Sends the client's opening bytes as one binary message and gathers what comes back until `done` says so. */
async function h2Exchange(ws: WebSocket, done: (bytes: Uint8Array) => boolean, ms = 10_000): Promise<Uint8Array> {
  let bytes = new Uint8Array(0);
  let binary = true;
  const settled = new Promise<Uint8Array>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no HTTP/2 answer in ${ms} ms; got ${bytes.length} bytes`)), ms);
    // Messages are appended in order: each waits for the one before it to be read.
    let read = Promise.resolve();
    ws.addEventListener("message", (event) => {
      if (typeof event.data === "string") binary = false;
      const data = event.data instanceof Blob ? event.data.arrayBuffer() : Promise.resolve(event.data as ArrayBuffer);
      read = read.then(async () => {
        const chunk = new Uint8Array(await data);
        const all = new Uint8Array(bytes.length + chunk.length);
        all.set(bytes);
        all.set(chunk, bytes.length);
        bytes = all;
        if (done(bytes)) {
          clearTimeout(timer);
          resolve(bytes);
        }
      });
    });
    ws.addEventListener("close", (event) => reject(new Error(`closed: ${event.code} ${event.reason}`)));
  });
  ws.accept();
  const hello = new Uint8Array(PREFACE.length + EMPTY_SETTINGS.length);
  hello.set(PREFACE);
  hello.set(EMPTY_SETTINGS, PREFACE.length);
  ws.send(hello);
  const out = await settled;
  expect(binary, "the tunnel answers in binary messages").toBe(true);
  return out;
}

const settingsAcked = (bytes: Uint8Array) => frames(bytes).some((f) => f.type === 4 && (f.flags & 1) === 1);

describe("the worker pool over a real skiff worker", () => {
  afterAll(async () => {
    if ((await info()).running) {
      await runInDurableObject(e.SKIFF_WORKER.getByName("worker-0"), (instance: SkiffWorkerContainer) => instance.destroy());
    }
  });

  it("needs the environment it runs in", () => {
    if (!e.SKIFF_TEST_TOKEN || !TOKEN) throw new Error("set SKIFF_BIN, SKIFF_E2E_LAKE and SKIFF_TEST_TOKEN (scripts/test does)");
  });

  it("refuses a wrong token, a client's token and a plain request in the Worker: no container starts", async () => {
    for (const token of ["wrong", e.SKIFF_TEST_TOKEN, TOKEN.slice(1)]) {
      const res = await open(token);
      expect(res.status, token).toBe(401);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("unauthorized");
    }
    const plain = await call("/_worker/0", { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(plain.status).toBe(426);
    expect((await call("/_worker/1", { headers: { upgrade: "websocket", authorization: `Bearer ${TOKEN}` } })).status).toBe(404);
    expect((await info()).starts).toBe(0);
  });

  it("tunnels HTTP/2 through /_worker/0 to the real skiff worker's gRPC server", async () => {
    const res = await open(TOKEN);
    expect(res.status, res.status === 101 ? "" : await res.text()).toBe(101);
    const ws = res.webSocket!;
    expect(ws).toBeTruthy();
    const bytes = await h2Exchange(ws, settingsAcked);
    // A server's first frame is its SETTINGS (RFC 9113, 3.4): type 4 at offset 3, not an ACK, stream 0.
    expect(bytes[3]).toBe(4);
    const [first] = frames(bytes);
    expect(first).toMatchObject({ type: 4, stream: 0 });
    expect(first!.flags & 1).toBe(0);
    // And it read ours: its ACK of our SETTINGS came back.
    expect(settingsAcked(bytes)).toBe(true);
    ws.close(1000, "done");

    // Started as `skiff worker` from the image's binary, with the pool's environment.
    const i = await info();
    expect(i.starts).toBe(1);
    expect(i.command).toEqual(["/usr/local/bin/skiff", "worker"]);
    const vars = i.env!;
    expect(vars.SKIFF_WORKER_TUNNEL_ADDR).toBe("0.0.0.0:8080");
    expect(vars.SKIFF_WORKER_ADDR).toBe("127.0.0.1:50051");
    expect(vars.SKIFF_WORKER_TOKEN).toBe(TOKEN);
    expect(vars.SKIFF_LOG_FORMAT).toBe("json");
    expect(vars.SKIFF_QUERY_HISTORY).toBe("77");
    // No client, admin or catalog token, and none of the Worker's own settings.
    for (const k of ["API_TOKEN", "SKIFF_API_TOKEN", "SKIFF_ADMIN_TOKEN", "CF_API_TOKEN", "SKIFF_CATALOG_TOKEN", "SKIFF_WORKERS", "SKIFF_WORKER_POOL", "SKIFF_PUBLIC_URL", "SKIFF_HTTP_ADDR"]) {
      expect(vars[k], k).toBeUndefined();
    }
  });

  it("the environment took effect in skiff: its tunnel listener, its token and its log format", async () => {
    const i = await info();
    expect(i.running).toBe(true);
    const tunnel = `http://127.0.0.1:${i.port}`;
    // The tunnel listener answers on the container's port.
    const health = await fetch(`${tunnel}/_health`);
    expect(health.status).toBe(200);
    expect(await health.json()).toEqual({ status: "ok" });
    // The tunnel holds the pool's token: it refuses another, and a request that is not an upgrade.
    const wrong = await fetch(`${tunnel}/_worker/0`, { headers: { upgrade: "websocket", authorization: "Bearer wrong" } });
    expect(wrong.status).toBe(401);
    expect(wrong.webSocket).toBeNull();
    await wrong.arrayBuffer();
    const plain = await fetch(`${tunnel}/_worker/0`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect([400, 426]).toContain(plain.status);
    await plain.arrayBuffer();
    const right = await fetch(`${tunnel}/_worker/0`, { headers: { upgrade: "websocket", authorization: `Bearer ${TOKEN}` } });
    expect(right.status).toBe(101);
    right.webSocket!.accept();
    right.webSocket!.close(1000, "done");
    // JSON logs, and never the token.
    const log = (await info()).log;
    expect(log.filter((l) => l.startsWith("{")).length).toBeGreaterThan(0);
    expect(log.every((l) => l === "" || l.startsWith("{")), log.join("\n")).toBe(true);
    expect(log.join("\n")).not.toContain(TOKEN);
  });

  it("a rotated token restarts the running worker with it at the next upgrade", async () => {
    // What a `wrangler secret put SKIFF_WORKER_TOKEN` does: a new env, the running container kept.
    const rotated = `${NEXT_TOKEN},${TOKEN}`;
    await runInDurableObject(e.SKIFF_WORKER.getByName("worker-0"), (instance: SkiffWorkerContainer) => {
      const self = instance as unknown as { env: Env };
      self.env = { ...self.env, SKIFF_WORKER_TOKEN: rotated };
    });
    const res = await open(NEXT_TOKEN, { SKIFF_WORKER_TOKEN: rotated });
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBeTruthy();
    expect(((await res.json()) as { error: { message: string } }).error.message).toContain("restarting");
    await eventually("the old worker exits on SIGTERM", async () => ((await info()).running ? undefined : true));

    const again = await eventually("the worker starts again", async () => {
      const r = await open(NEXT_TOKEN, { SKIFF_WORKER_TOKEN: rotated });
      if (r.status === 101) return r;
      await r.arrayBuffer();
      return undefined;
    });
    const bytes = await h2Exchange(again.webSocket!, settingsAcked);
    expect(frames(bytes)[0]).toMatchObject({ type: 4, stream: 0 });
    again.webSocket!.close(1000, "done");
    const i = await info();
    expect(i.starts).toBe(2);
    expect(i.env!.SKIFF_WORKER_TOKEN).toBe(rotated);
    // The old token is still accepted during the rotation (the list), by the Worker and by skiff.
    const old = await open(TOKEN, { SKIFF_WORKER_TOKEN: rotated });
    expect(old.status).toBe(101);
    old.webSocket!.accept();
    old.webSocket!.close(1000, "done");
  });
});

describe("a coordinator with a pool, over a real skiff serve", () => {
  // Its own instance, beside container.e2e.test.ts's; reached at its Durable Object (the Worker's part is above).
  const NAME = "pool-coordinator";
  const stub = () => e.SKIFF_CT.getByName(NAME);
  const query = () =>
    stub().fetch("https://skiff.example.com/query", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ query: "SELECT 1 AS one" }),
    });
  /** What a deploy with new vars or secrets does to the object: a new env, the running container kept. */
  const setEnv = (vars: Partial<Env>) =>
    runInDurableObject(stub(), (instance: SkiffContainer) => {
      const self = instance as unknown as { env: Env };
      self.env = { ...self.env, ...vars };
    });

  afterAll(async () => {
    if ((await info(e.SKIFF_CT, NAME)).running) await runInDurableObject(stub(), (instance: SkiffContainer) => instance.destroy());
  });

  it("starts skiff serve with the pool's tunnel URLs and token", async () => {
    await setEnv({ SKIFF_WORKER_POOL: "2", SKIFF_PUBLIC_URL: "http://127.0.0.1:8787" });
    const res = await query();
    expect(res.status, await res.clone().text()).toBe(200);
    expect(await res.json()).toEqual([{ one: 1 }]);
    const i = await info(e.SKIFF_CT, NAME);
    expect(i.command).toEqual(["/usr/local/bin/skiff", "serve"]);
    expect(i.env!.SKIFF_WORKERS).toBe("ws://127.0.0.1:8787/_worker/0,ws://127.0.0.1:8787/_worker/1");
    expect(i.env!.SKIFF_WORKER_TOKEN).toBe(TOKEN);
    expect(i.env!.SKIFF_WORKER_POOL).toBeUndefined();
    expect(i.log.join("\n")).not.toContain(TOKEN);
  });

  it("a changed pool stops the running coordinator; the next request starts it with the new pool", async () => {
    await setEnv({ SKIFF_WORKER_POOL: "1" });
    const res = await query();
    expect(res.status).toBe(503);
    expect(await res.text()).toMatch(/^Restarting container: the worker pool changed/);
    await eventually("skiff exits on SIGTERM", async () => ((await info(e.SKIFF_CT, NAME)).running ? undefined : true));
    const again = await eventually("skiff answers again", async () => {
      const r = await query();
      if (r.status === 200) return r;
      await r.arrayBuffer();
      return undefined;
    });
    expect(await again.json()).toEqual([{ one: 1 }]);
    const i = await info(e.SKIFF_CT, NAME);
    expect(i.starts).toBe(2);
    expect(i.env!.SKIFF_WORKERS).toBe("ws://127.0.0.1:8787/_worker/0");
    // Unchanged settings restart nothing.
    expect((await query()).status).toBe(200);
    expect((await info(e.SKIFF_CT, NAME)).starts).toBe(2);
  });
});
