// TEST-ONLY: the production container classes (SkiffContainer in src/container.ts and
// SkiffWorkerContainer in src/worker-container.ts, unchanged, with @cloudflare/containers'
// Container under them) run in workerd, where Cloudflare's container runtime (`ctx.container`)
// does not exist. These subclasses hand them a stand-in for that runtime whose process is the
// real skiff binary, started by the LAUNCHER service in Node (test/e2e/launcher.ts): the
// classes' environment, entrypoint, port, start, readiness, lifecycle hooks, credentials,
// catalog token push and WebSocket proxying all run against a real skiff.
import { SkiffContainer } from "../../src/container";
import type { Env } from "../../src/env";
import { SkiffWorkerContainer } from "../../src/worker-container";

const LAUNCH = "http://launcher";

/** Per Durable Object id, the process as this isolate knows it: kept when the object is reset. */
const known = new Map<string, { running: boolean; port: Promise<number> }>();

/** The parts of workerd's `Container` that @cloudflare/containers 0.3.7 uses. */
class LauncherContainer {
  constructor(
    private readonly launcher: Fetcher,
    private readonly id: string,
  ) {}

  get running(): boolean {
    return known.get(this.id)?.running ?? false;
  }

  start(options?: { env?: Record<string, string>; entrypoint?: string[] }): void {
    if (this.running) throw new Error("start() cannot be called on a container that is already running.");
    const body = { id: this.id, env: options?.env ?? {}, entrypoint: options?.entrypoint };
    const port = this.launcher
      .fetch(`${LAUNCH}/start`, { method: "POST", body: JSON.stringify(body) })
      .then(async (r) => {
        if (!r.ok) throw new Error(`the container could not start: ${await r.text()}`);
        return ((await r.json()) as { port: number }).port;
      });
    const entry = { running: true, port };
    known.set(this.id, entry);
    port.catch(() => (entry.running = false));
  }

  /** Resolves when the process exits 0; rejects as workerd does for another exit code. */
  async monitor(): Promise<void> {
    const entry = known.get(this.id);
    if (!entry) throw new Error("the container is not running");
    await entry.port;
    const r = await this.launcher.fetch(`${LAUNCH}/wait`, { method: "POST", body: JSON.stringify({ id: this.id }) });
    const { code } = (await r.json()) as { code: number };
    entry.running = false;
    if (code !== 0) throw new Error(`Container exited with unexpected exit code: ${code}`);
  }

  getTcpPort(port: number): Fetcher {
    const fetchPort = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
      const entry = known.get(this.id);
      if (!entry?.running || port !== 8080) throw new Error("the container is not listening");
      const hostPort = await entry.port;
      const request = new Request(input, init);
      const u = new URL(request.url);
      try {
        // A WebSocket upgrade too: workerd's fetch makes the handshake and returns the socket.
        return await fetch(new Request(`http://127.0.0.1:${hostPort}${u.pathname}${u.search}`, request));
      } catch (error) {
        // What workerd says while nothing accepts on the port yet.
        throw new Error(`the container is not listening: ${error instanceof Error ? error.message : String(error)}`);
      }
    };
    return { fetch: fetchPort } as unknown as Fetcher;
  }

  signal(signo: number): void {
    void this.launcher.fetch(`${LAUNCH}/signal`, { method: "POST", body: JSON.stringify({ id: this.id, signo }) });
  }

  async destroy(): Promise<void> {
    this.signal(9);
    await this.monitor().catch(() => undefined);
  }
}

export interface LauncherEnv {
  LAUNCHER: Fetcher;
}

/**
 * The real state (the Durable Object base class takes nothing else), with its `container`
 * (undefined here: no container runtime) shadowed by one that starts skiff through the launcher.
 */
function withLauncher(ctx: DurableObjectState<{}>, env: LauncherEnv): DurableObjectState<{}> {
  Object.defineProperty(ctx, "container", { value: new LauncherContainer(env.LAUNCHER, ctx.id.toString()), configurable: true });
  return ctx;
}

export class TestSkiffContainer extends SkiffContainer {
  constructor(ctx: DurableObjectState<{}>, env: Env & LauncherEnv) {
    super(withLauncher(ctx, env), env);
  }
}

export class TestSkiffWorkerContainer extends SkiffWorkerContainer {
  constructor(ctx: DurableObjectState<{}>, env: Env & LauncherEnv) {
    super(withLauncher(ctx, env), env);
  }
}
