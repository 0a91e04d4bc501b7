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
]);

/** Passed as they are, besides every `SKIFF_*`. */
const PASSED_AS_IS = ["LAKE_VERSIONS", "CF_API_TOKEN", "RUST_LOG"];

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
 * Settings and secrets handed to skiff as environment variables when the container starts:
 * every `SKIFF_*` var or secret (limits, caches, log format, disabled rules, the catalog token),
 * LAKE_VERSIONS, CF_API_TOKEN and RUST_LOG, except the Worker's own settings; logs are JSON
 * unless SKIFF_LOG_FORMAT says otherwise.
 */
export function containerEnvVars(env: Env, credentials: InternalCredentials): Record<string, string> {
  const vars: Record<string, string> = { SKIFF_LOG_FORMAT: "json" };
  for (const [key, value] of Object.entries(env)) {
    // Unset or empty values are left out, so skiff's own defaults and fallbacks apply.
    if (typeof value !== "string" || value === "") continue;
    if (WORKER_ONLY.has(key) || SET_BY_CONTAINER.has(key)) continue;
    if (key.startsWith("SKIFF_") || PASSED_AS_IS.includes(key)) vars[key] = value;
  }
  // Listen on all interfaces: the Durable Object reaches the container over its network.
  vars.SKIFF_HTTP_ADDR = `0.0.0.0:${SKIFF_PORT}`;
  // Only HTTP reaches a container, so Arrow Flight (gRPC) stays off.
  vars.SKIFF_FLIGHT_ADDR = "off";
  vars.API_TOKEN = credentials.query;
  vars.SKIFF_ADMIN_TOKEN = credentials.admin;
  return vars;
}

/** @cloudflare/containers answers its own failures as text/plain responses; these are their kinds. */
export type ContainerFailure = "start_failed" | "no_instance" | "rate_limited" | "connection_lost";

// The opening words of those answers (0.3.7), each with its status.
const CONTAINER_FAILURES: [number, string, ContainerFailure][] = [
  [500, "Failed to start container", "start_failed"],
  [503, "There is no Container instance available", "no_instance"],
  [429, "you are requesting too many containers per second", "rate_limited"],
  [500, "Container suddenly disconnected", "connection_lost"],
  [500, "Error proxying request to container", "connection_lost"],
];

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

async function digest(s: string): Promise<string> {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(s)));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

const CREDENTIALS_KEY = "skiff:credentials";
/** SHA-256 of the catalog token the running skiff holds (given at start or pushed since). */
const CATALOG_DIGEST_KEY = "skiff:catalog-token-sha256";

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
    } else {
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
