// A stand-in for SkiffContainer and SkiffWorkerContainer. Cloudflare's container runtime (the
// Durable Object's `ctx.container`) cannot run here, so the unit tests bind SKIFF and
// SKIFF_WORKER to this plain Durable Object instead. It answers as skiff in the container would:
// it echoes what it received (for a WebSocket upgrade: as the first message, then every message
// back), and on request (test-only header `x-stand-in`) it streams slowly, fails like
// @cloudflare/containers does when a container cannot start, or throws.
import { DurableObject } from "cloudflare:workers";
import { restartAnswer, type InstanceReport } from "../../src/container";

export interface Echo {
  instance: string | undefined;
  method: string;
  path: string;
  headers: Record<string, string>;
  /** The request body's bytes, base64. */
  body: string;
}

export const CHUNK_1 = "first chunk|";
export const CHUNK_2 = "second chunk";

function base64(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}

export class StandInContainer extends DurableObject {
  // Resolved by a request to /__release: lets the streaming test decide when chunk 2 is sent.
  private release: (() => void) | null = null;

  override async fetch(request: Request): Promise<Response> {
    const url = new URL(request.url);
    if (url.pathname === "/__release") {
      const release = this.release;
      this.release = null;
      release?.();
      return new Response(release ? "released" : "nothing to release");
    }

    switch (request.headers.get("x-stand-in")) {
      // What @cloudflare/containers 0.3 answers when the container cannot start or is gone.
      case "fail-start":
        return new Response("Failed to start container: the container exited with code 1", { status: 500 });
      case "no-instance":
        return new Response("There is no Container instance available at this time.", { status: 503 });
      case "disconnected":
        return new Response("Container suddenly disconnected, try again", { status: 500 });
      case "rate-limited":
        return new Response("you are requesting too many containers per second", { status: 429 });
      case "restarting":
        return restartAnswer("the worker pool changed; skiff restarts with it");
      // What skiff's tunnel answers a token it does not hold.
      case "tunnel-401":
        return Response.json({ error: "unauthorized" }, { status: 401 });
      case "throw":
        throw new Error("durable object broke");
      // skiff's own errors must pass through untouched.
      case "skiff-500":
        return Response.json({ error: { code: "internal", message: "boom" } }, { status: 500 });
      case "text-500":
        return new Response("some other plain failure", { status: 500 });
      case "stream":
        return this.slowStream();
    }

    const echo: Echo = {
      instance: this.ctx.id.name,
      method: request.method,
      path: url.pathname + url.search,
      headers: Object.fromEntries(request.headers),
      body: base64(new Uint8Array(await request.arrayBuffer())),
    };
    if (request.headers.get("upgrade")?.toLowerCase() === "websocket") {
      const [client, server] = Object.values(new WebSocketPair()) as [WebSocket, WebSocket];
      server.accept();
      server.send(JSON.stringify(echo));
      // Binary messages arrive as Blobs at this compatibility date, as the library also expects.
      server.addEventListener("message", (event) => {
        if (event.data instanceof Blob) void event.data.arrayBuffer().then((b) => server.send(b));
        else server.send(event.data);
      });
      return new Response(null, { status: 101, webSocket: client, headers: { "x-from": "stand-in" } });
    }
    return Response.json(echo, { headers: { "x-from": "stand-in" } });
  }

  /** What SkiffContainer.report() answers for an instance whose container sleeps. */
  async report(): Promise<InstanceReport> {
    return { running: false, state: { status: "stopped", lastChange: Date.now() }, lastError: null, skiff: null };
  }

  /** Chunk 1 now; chunk 2 only once the test, having read chunk 1, calls /__release. */
  private slowStream(): Response {
    const { readable, writable } = new TransformStream<Uint8Array, Uint8Array>();
    const released = new Promise<void>((resolve) => (this.release = resolve));
    const writer = writable.getWriter();
    const enc = new TextEncoder();
    void (async () => {
      await writer.write(enc.encode(CHUNK_1));
      await released;
      await writer.write(enc.encode(CHUNK_2));
      await writer.close();
    })();
    return new Response(readable, { headers: { "content-type": "application/vnd.apache.arrow.stream" } });
  }
}
