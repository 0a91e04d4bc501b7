import { Container } from "@cloudflare/containers";
import type { StopParams } from "@cloudflare/containers";
import {
  CATALOG_SECRETS,
  SKIFF_PORT,
  containerFailure,
  describe,
  digest,
  parseDuration,
  passedSettings,
  restartAnswer,
  sleep,
} from "./container";
import type { Env } from "./env";

/** Where `skiff worker`'s gRPC server listens: the container's loopback, reached only through the tunnel. */
export const WORKER_GRPC_ADDR = "127.0.0.1:50051";

/** The image's binary (the Dockerfile's ENTRYPOINT) run as `skiff worker` instead of its CMD `serve`. */
export const WORKER_ENTRYPOINT = ["/usr/local/bin/skiff", "worker"];

/** SHA-256 of the tunnel token the running worker was started with. */
const TOKEN_DIGEST_KEY = "skiff-worker:token-sha256";

/**
 * What `skiff worker` is started with: the settings every skiff gets (passedSettings: limits,
 * caches, log format), without the catalog's credentials (storage travels inside each plan it
 * is sent); its gRPC server on loopback, the tunnel listener on the container's port, and the
 * pool's token, which the tunnel checks on every upgrade.
 */
export function workerEnvVars(env: Env): Record<string, string> {
  const vars = passedSettings(env);
  for (const k of CATALOG_SECRETS) delete vars[k];
  const token = env.SKIFF_WORKER_TOKEN;
  if (typeof token !== "string" || token === "") throw new Error("SKIFF_WORKER_TOKEN is not set");
  vars.SKIFF_WORKER_ADDR = WORKER_GRPC_ADDR;
  vars.SKIFF_WORKER_TUNNEL_ADDR = `0.0.0.0:${SKIFF_PORT}`;
  vars.SKIFF_WORKER_TOKEN = token;
  return vars;
}

/**
 * One `skiff worker` of the pool (Durable Object names `worker-0` … `worker-{N-1}`). The Worker
 * has checked the coordinator's token on `/_worker/<n>` and forwards the WebSocket upgrade
 * here unchanged (the tunnel checks the token again); @cloudflare/containers answers it by
 * proxying the WebSocket's messages both ways, which keeps the container awake while a
 * coordinator holds its connection open.
 */
export class SkiffWorkerContainer extends Container<Env> {
  override defaultPort = SKIFF_PORT;
  override entrypoint = WORKER_ENTRYPOINT;
  // As the coordinator's: its data cache outlives a quiet spell.
  override sleepAfter = "10m";

  /** Whether the tunnel listener answered /_health 200 since this object last saw the container start. */
  private ready = false;
  private restarting = false;

  override async fetch(request: Request): Promise<Response> {
    const want = await digest(String(this.env.SKIFF_WORKER_TOKEN ?? ""));
    if (!this.ctx.container?.running) {
      this.ready = false;
      this.envVars = workerEnvVars(this.env);
      // Kept now, not at onStart: a request that comes while this start is under way must see
      // the token the container is being started with.
      this.ctx.storage.kv.put(TOKEN_DIGEST_KEY, want);
    } else if (this.ctx.storage.kv.get<string>(TOKEN_DIGEST_KEY) !== want) {
      // A rotated token: the running worker would refuse every coordinator that holds the new
      // one, and a worker in use never sleeps. Stopped once (SIGTERM); the next upgrade starts it.
      if (!this.restarting) {
        this.restarting = true;
        console.log(JSON.stringify({ event: "skiff_worker_restarting", instance: this.ctx.id.toString(), why: "token rotated" }));
        await this.stop();
      }
      return restartAnswer("SKIFF_WORKER_TOKEN changed; the worker restarts with it");
    }
    if (!this.ready) {
      const failure = await this.untilReady();
      if (failure) return failure;
    }
    // The port is this class's, whatever a cf-container-target-port header says.
    return this.containerFetch(request, SKIFF_PORT);
  }

  /**
   * Starts the container if needed and waits until the tunnel listener answers `/_health` 200
   * (the library's own check only sees the port open). Returns the answer to give instead of
   * forwarding: the library's failure, or a 503 when the worker is not ready in time.
   */
  private async untilReady(): Promise<Response | null> {
    const deadline = Date.now() + parseDuration(this.env.SKIFF_READY_TIMEOUT, 30_000);
    for (;;) {
      const res = await this.containerFetch(new Request("http://skiff/_health"), SKIFF_PORT);
      // Read, not cancelled: the library pipes the body, and a cancel would reject its pipe.
      const body = await res.text();
      if (res.status === 200) {
        this.ready = true;
        return null;
      }
      if (await containerFailure(new Response(body, res))) return new Response(body, res);
      if (Date.now() >= deadline) {
        return new Response(`skiff worker is not ready: its /_health answered ${res.status}`, {
          status: 503,
          headers: { "content-type": "text/plain", "retry-after": "5" },
        });
      }
      await sleep(100);
    }
  }

  override onStart(): void {
    console.log(JSON.stringify({ event: "skiff_worker_started", instance: this.ctx.id.toString() }));
  }

  override onStop(params: StopParams): void {
    this.ready = false;
    this.restarting = false;
    console.log(
      JSON.stringify({ event: "skiff_worker_stopped", instance: this.ctx.id.toString(), exitCode: params.exitCode, reason: params.reason }),
    );
  }

  // The library already answers the failure (the coordinator sees the upgrade refused): log only.
  override onError(error: unknown): void {
    this.ready = false;
    console.error(JSON.stringify({ event: "skiff_worker_error", instance: this.ctx.id.toString(), error: describe(error) }));
  }
}
