import { Container } from "@cloudflare/containers";
import type { State, StopParams } from "@cloudflare/containers";
import type { Env } from "./env";

/** The port skiff listens on inside the container (SKIFF_HTTP_ADDR below). */
export const SKIFF_PORT = 8080;

/** The Worker's own settings: they never reach skiff. */
export const WORKER_ONLY: ReadonlySet<string> = new Set([
  "SKIFF_INSTANCES",
  "SKIFF_SHARD_HEADER",
  "SKIFF_LOCATION_HINT",
  "SKIFF_READY_TIMEOUT",
  "SKIFF_WORKER_POOL",
  "SKIFF_PUBLIC_URL",
]);

/** What this class sets itself: a var or secret of the same name is not passed. */
export const SET_BY_CONTAINER: ReadonlySet<string> = new Set([
  "SKIFF_HTTP_ADDR",
  "SKIFF_FLIGHT_ADDR",
  // skiff's bearer tokens in the container are this Durable Object's own (see credentials()):
  // clients' tokens are checked by the Worker and never reach the container.
  "API_TOKEN",
  "SKIFF_API_TOKEN",
  "SKIFF_ADMIN_TOKEN",
  // Distribution: derived from SKIFF_WORKER_POOL and SKIFF_PUBLIC_URL, and the pool's token goes
  // only where the pool is used, never to another host a var might name.
  "SKIFF_WORKERS",
  "SKIFF_WORKER_TOKEN",
  // A worker container's own listeners (SkiffWorkerContainer).
  "SKIFF_WORKER_ADDR",
  "SKIFF_WORKER_TUNNEL_ADDR",
]);

/** Passed as they are, besides every `SKIFF_*`. */
const PASSED_AS_IS = ["LAKE_VERSIONS", "CF_API_TOKEN", "RUST_LOG"];

/** The catalog's credentials: a worker container never talks to the catalog, so it never gets them. */
export const CATALOG_SECRETS: ReadonlySet<string> = new Set(["CF_API_TOKEN", "SKIFF_CATALOG_TOKEN"]);

/** The credentials skiff in the container trusts: one for queries, one for its admin route. */
export interface InternalCredentials {
  query: string;
  admin: string;
}

/** The token skiff sends to the catalog: skiff prefers SKIFF_CATALOG_TOKEN over CF_API_TOKEN. */
export function catalogToken(env: Env): string {
  for (const key of ["SKIFF_CATALOG_TOKEN", "CF_API_TOKEN"]) {
    const v = env[key];
    if (typeof v === "string" && v !== "") return v;
  }
  return "";
}

/**
 * The settings and secrets every skiff container gets as they are: every `SKIFF_*` var or
 * secret (limits, caches, log format, disabled rules, the catalog token), LAKE_VERSIONS,
 * CF_API_TOKEN and RUST_LOG, except the Worker's own settings and what the classes set
 * themselves; logs are JSON unless SKIFF_LOG_FORMAT says otherwise.
 */
export function passedSettings(env: Env): Record<string, string> {
  const vars: Record<string, string> = { SKIFF_LOG_FORMAT: "json" };
  for (const [key, value] of Object.entries(env)) {
    // Unset or empty values are left out, so skiff's own defaults and fallbacks apply.
    if (typeof value !== "string" || value === "") continue;
    if (WORKER_ONLY.has(key) || SET_BY_CONTAINER.has(key)) continue;
    if (key.startsWith("SKIFF_") || PASSED_AS_IS.includes(key)) vars[key] = value;
  }
  return vars;
}

/**
 * Settings and secrets handed to the coordinator, `skiff serve`, when its container starts:
 * passedSettings, its listeners and its own tokens, and with a worker pool the pool's URLs
 * and token.
 */
export function containerEnvVars(env: Env, credentials: InternalCredentials): Record<string, string> {
  const vars = passedSettings(env);
  // Listen on all interfaces: the Durable Object reaches the container over its network.
  vars.SKIFF_HTTP_ADDR = `0.0.0.0:${SKIFF_PORT}`;
  // Only HTTP reaches a container, so Arrow Flight (gRPC) stays off.
  vars.SKIFF_FLIGHT_ADDR = "off";
  vars.API_TOKEN = credentials.query;
  vars.SKIFF_ADMIN_TOKEN = credentials.admin;
  const pool = distribution(env);
  if (pool) {
    vars.SKIFF_WORKERS = pool.workers.join(",");
    vars.SKIFF_WORKER_TOKEN = pool.token;
  }
  return vars;
}

/** SKIFF_WORKER_POOL as a number of worker containers: unset or "" is 0; null if it is not a count. */
export function workerPoolSize(raw: unknown): number | null {
  if (raw === undefined || raw === null || (typeof raw === "string" && raw.trim() === "")) return 0;
  if (typeof raw !== "string" || !/^\s*\d+\s*$/.test(raw)) return null;
  return Number.parseInt(raw, 10);
}

/**
 * The tunnel URL of each worker container as the coordinator dials it: through the Worker's
 * public host (the only way into a container), `wss://` for `https://` and `ws://` for
 * `http://` (local runs). Throws on a SKIFF_PUBLIC_URL that is not a bare http(s) origin.
 */
export function workerUrls(publicUrl: string, pool: number): string[] {
  let url: URL;
  try {
    url = new URL(publicUrl.trim());
  } catch {
    throw new Error(`SKIFF_PUBLIC_URL ${publicUrl} is not a URL`);
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") throw new Error(`SKIFF_PUBLIC_URL ${publicUrl} is not http(s)`);
  // The route is at the host's root; a path, query or credentials would be dropped or misread.
  if (url.pathname !== "/" || url.search !== "" || url.hash !== "" || url.username !== "" || url.password !== "") {
    throw new Error(`SKIFF_PUBLIC_URL ${publicUrl} must be the Worker's origin only, like https://skiff.example.workers.dev`);
  }
  const scheme = url.protocol === "https:" ? "wss" : "ws";
  return Array.from({ length: pool }, (_, n) => `${scheme}://${url.host}/_worker/${n}`);
}

/** The worker pool the coordinator is given, or null when queries are not distributed. */
export function distribution(env: Env): { workers: string[]; token: string } | null {
  const pool = workerPoolSize(env.SKIFF_WORKER_POOL);
  if (pool === null) throw new Error(`SKIFF_WORKER_POOL ${String(env.SKIFF_WORKER_POOL)} is not a number of containers`);
  if (pool === 0) return null;
  const token = env.SKIFF_WORKER_TOKEN;
  if (typeof token !== "string" || token === "") throw new Error("SKIFF_WORKER_TOKEN is not set");
  return { workers: workerUrls(String(env.SKIFF_PUBLIC_URL ?? ""), pool), token };
}

/** @cloudflare/containers answers its own failures as text/plain responses; these are their kinds. */
export type ContainerFailure = "start_failed" | "no_instance" | "rate_limited" | "connection_lost" | "restarting";

// The opening words of those answers (0.3.7), each with its status; and this module's own
// answer while a container restarts to take new settings (restartAnswer).
const CONTAINER_FAILURES: [number, string, ContainerFailure][] = [
  [500, "Failed to start container", "start_failed"],
  [503, "There is no Container instance available", "no_instance"],
  [429, "you are requesting too many containers per second", "rate_limited"],
  [500, "Container suddenly disconnected", "connection_lost"],
  [500, "Error proxying request to container", "connection_lost"],
  [503, "Restarting container", "restarting"],
];

/** What a request gets while its container stops to be started again with new settings. */
export function restartAnswer(why: string): Response {
  return new Response(`Restarting container: ${why}`, { status: 503, headers: { "content-type": "text/plain" } });
}

/** The library's failure a response stands for, if it is one (not skiff's own answer). */
export async function containerFailure(res: Response): Promise<{ kind: ContainerFailure; text: string } | null> {
  if (![429, 500, 503].includes(res.status)) return null;
  if (!(res.headers.get("content-type") ?? "").startsWith("text/plain")) return null;
  // Only small plain-text error bodies get here, never a query result; read a copy.
  const text = await res.clone().text();
  for (const [status, prefix, kind] of CONTAINER_FAILURES) {
    if (res.status === status && text.toLowerCase().startsWith(prefix.toLowerCase())) return { kind, text };
  }
  return null;
}

/** Only the message: errors from the runtime never need the env (which holds secrets) to be useful. */
export function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** `30s`, `500ms`, `2m` in milliseconds; the fallback for anything else. */
export function parseDuration(raw: unknown, fallbackMs: number): number {
  const m = typeof raw === "string" ? /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$/.exec(raw) : null;
  if (!m) return fallbackMs;
  const n = Number(m[1]);
  return m[2] === "ms" ? n : m[2] === "m" ? n * 60_000 : n * 1000;
}

function randomToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export async function digest(s: string): Promise<string> {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(s)));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

const CREDENTIALS_KEY = "skiff:credentials";
/** SHA-256 of the catalog token the running skiff holds (given at start or pushed since). */
const CATALOG_DIGEST_KEY = "skiff:catalog-token-sha256";
/** SHA-256 of the worker pool (URLs and token) the running skiff was started with; absent: none. */
const WORKERS_DIGEST_KEY = "skiff:workers-sha256";

/** A digest of the worker pool in a coordinator's env vars, or null without one. */
async function workersDigest(vars: Record<string, string>): Promise<string | null> {
  return vars.SKIFF_WORKERS ? digest(`${vars.SKIFF_WORKERS}\n${vars.SKIFF_WORKER_TOKEN ?? ""}`) : null;
}

/** What an authenticated deep health check shows: this instance's container, without starting it. */
export interface InstanceReport {
  /** Whether the container is running now. */
  running: boolean;
  /** The container library's state: `stopped`, `running`, `healthy`, `stopping`, `stopped_with_code` (with exitCode). */
  state: State;
  /** The last start failure or crash this object saw, if any. */
  lastError: string | null;
  /** skiff's own `/_health` answer when the container runs (status, body), else null. */
  skiff: { status: number; body: unknown } | { error: string } | null;
}

/**
 * One skiff process. The Durable Object (one per instance name) starts the container on the
 * first request, proxies HTTP to port 8080, and stops it after `sleepAfter` without requests.
 *
 * The Worker has already checked the client's token. This object replaces it with its own
 * credential, generated once per instance and kept in its storage, which the container was
 * started with (API_TOKEN): so rotating clients' tokens takes effect in the Worker at once,
 * without restarting skiff. The catalog token is the container's own: when the one in the env
 * changes (a `wrangler secret put` deploys a new version with the running container kept), it
 * is pushed to skiff's admin route before the next request is forwarded.
 */
export class SkiffContainer extends Container<Env> {
  override defaultPort = SKIFF_PORT;
  // Long enough that the catalog and footer caches outlive a quiet spell between dashboard loads.
  override sleepAfter = "10m";

  /** Whether skiff answered /_health 200 since this object last saw the container start. */
  private ready = false;
  private lastError: string | null = null;
  /** The catalog token digest of the env the container is being started with. */
  private startingDigest: string | null = null;
  /** Whether this object has already asked the running container to stop for new settings. */
  private restarting = false;
  private pushing: Promise<void> | null = null;

  /** This instance's credentials, made on first use and kept for the instance's life. */
  credentials(): InternalCredentials {
    let c = this.ctx.storage.kv.get<InternalCredentials>(CREDENTIALS_KEY);
    if (!c) {
      c = { query: randomToken(), admin: randomToken() };
      this.ctx.storage.kv.put(CREDENTIALS_KEY, c);
    }
    return c;
  }

  override async fetch(request: Request): Promise<Response> {
    const credentials = this.credentials();
    if (!this.ctx.container?.running) {
      this.ready = false;
      // Read at this start: the settings and secrets as they are now.
      this.envVars = containerEnvVars(this.env, credentials);
      this.startingDigest = await digest(catalogToken(this.env));
      // Kept now, not at onStart: a request that comes while this start is under way must see
      // the pool the container is being started with, not an old one.
      const workers = await workersDigest(this.envVars);
      if (workers !== null) this.ctx.storage.kv.put(WORKERS_DIGEST_KEY, workers);
      else this.ctx.storage.kv.delete(WORKERS_DIGEST_KEY);
    } else {
      const restart = await this.restartForNewPool(credentials);
      if (restart) return restart;
      await this.pushCatalogToken(credentials);
    }
    if (!this.ready) {
      const failure = await this.untilReady();
      if (failure) return failure;
    }
    const headers = new Headers(request.headers);
    headers.set("authorization", `Bearer ${credentials.query}`);
    // The library reads this header to pick the container port: never a client's.
    headers.delete("cf-container-target-port");
    return this.containerFetch(new Request(request, { headers }), SKIFF_PORT);
  }

  /**
   * Starts the container if needed and waits until skiff says it is ready (`/_health` 200).
   * The library's readiness check (0.3.7) only sees the port open, and skiff listens at once,
   * answering 503 `starting` until it has reached the catalog. Returns the library's failure
   * to answer with, or null to forward the request: to a ready skiff, or to one that has
   * reported why it is not ready (catalog unreachable, credentials refused), which answers
   * the request 503 with that cause itself.
   */
  private async untilReady(): Promise<Response | null> {
    const deadline = Date.now() + parseDuration(this.env.SKIFF_READY_TIMEOUT, 30_000);
    for (;;) {
      const res = await this.containerFetch(new Request("http://skiff/_health"), SKIFF_PORT);
      if (res.status === 200) {
        // Read, not cancelled: the library pipes the body, and a cancel would reject its pipe.
        await res.arrayBuffer();
        this.ready = true;
        return null;
      }
      if (await containerFailure(res)) return res;
      const body = (await res.json().catch(() => null)) as { status?: string; cause?: string } | null;
      if (body?.status !== "starting" || body.cause || Date.now() >= deadline) return null;
      await sleep(100);
    }
  }

  /**
   * skiff reads its worker pool only at start. A pool that changed (SKIFF_WORKER_POOL,
   * SKIFF_PUBLIC_URL, or a rotated SKIFF_WORKER_TOKEN, which the Worker and new worker
   * containers already hold) would leave a busy coordinator, which never sleeps, failing every
   * distributed query: so it is stopped (SIGTERM, its running queries finish) and the request
   * answered 503; the next one starts it with the new pool.
   */
  private async restartForNewPool(credentials: InternalCredentials): Promise<Response | null> {
    const want = await workersDigest(containerEnvVars(this.env, credentials));
    if ((this.ctx.storage.kv.get<string>(WORKERS_DIGEST_KEY) ?? null) === want) return null;
    if (!this.restarting) {
      // One signal: a second SIGTERM would cut skiff's grace for running queries short.
      this.restarting = true;
      console.log(JSON.stringify({ event: "skiff_restarting", instance: this.ctx.id.toString(), why: "worker pool changed" }));
      await this.stop();
    }
    return restartAnswer("the worker pool changed; skiff restarts with it");
  }

  /** Pushes the env's catalog token to the running skiff if it is not the one skiff holds. */
  private pushCatalogToken(credentials: InternalCredentials): Promise<void> {
    // Concurrent requests share one push.
    this.pushing ??= this.doPush(credentials).finally(() => (this.pushing = null));
    return this.pushing;
  }

  private async doPush(credentials: InternalCredentials): Promise<void> {
    const token = catalogToken(this.env);
    const want = await digest(token);
    if (this.ctx.storage.kv.get<string>(CATALOG_DIGEST_KEY) === want) return;
    try {
      const res = await this.ctx.container!.getTcpPort(SKIFF_PORT).fetch("http://skiff/_admin/credentials", {
        method: "POST",
        headers: { authorization: `Bearer ${credentials.admin}`, "content-type": "application/json" },
        body: JSON.stringify({ catalog_token: token }),
      });
      const text = await res.text();
      if (res.ok) {
        this.ctx.storage.kv.put(CATALOG_DIGEST_KEY, want);
        console.log(JSON.stringify({ event: "skiff_catalog_token_pushed", instance: this.ctx.id.toString() }));
      } else {
        // skiff's message never holds the token.
        console.error(
          JSON.stringify({ event: "skiff_catalog_token_push_failed", instance: this.ctx.id.toString(), status: res.status, body: text.slice(0, 500) }),
        );
      }
    } catch (error) {
      console.error(
        JSON.stringify({ event: "skiff_catalog_token_push_failed", instance: this.ctx.id.toString(), error: describe(error) }),
      );
    }
  }

  /** The container's state for an authenticated deep health check; never starts it. */
  async report(): Promise<InstanceReport> {
    const running = this.ctx.container?.running ?? false;
    let skiff: InstanceReport["skiff"] = null;
    if (running) {
      try {
        // Straight to the port: a health check neither starts the container nor renews its activity.
        const res = await this.ctx.container!.getTcpPort(SKIFF_PORT).fetch("http://skiff/_health", {
          signal: AbortSignal.timeout(5000),
        });
        skiff = { status: res.status, body: await res.json().catch(() => null) };
      } catch (error) {
        skiff = { error: describe(error) };
      }
    }
    return { running, state: await this.getState(), lastError: this.lastError, skiff };
  }

  override onStart(): void {
    if (this.startingDigest !== null) this.ctx.storage.kv.put(CATALOG_DIGEST_KEY, this.startingDigest);
    console.log(JSON.stringify({ event: "skiff_container_started", instance: this.ctx.id.toString() }));
  }

  override onStop(params: StopParams): void {
    this.ready = false;
    this.restarting = false;
    // A non-zero exit code here is most often an OOM kill (consider a bigger instance_type) or
    // a configuration skiff refused at start (its log line says which).
    console.log(
      JSON.stringify({
        event: "skiff_container_stopped",
        instance: this.ctx.id.toString(),
        exitCode: params.exitCode,
        reason: params.reason,
      }),
    );
  }

  // Called when the container fails to start or crashes. The library already turns the failure
  // into an error response (which the Worker maps to 503), so log and don't rethrow.
  override onError(error: unknown): void {
    this.ready = false;
    this.lastError = describe(error);
    console.error(
      JSON.stringify({ event: "skiff_container_error", instance: this.ctx.id.toString(), error: this.lastError }),
    );
  }
}
