import { SkiffContainer, containerFailure, describe, workerPoolSize, workerUrls } from "./container";
import type { InstanceReport } from "./container";
import type { Env } from "./env";
import { SkiffWorkerContainer } from "./worker-container";

// The Durable Object classes must be exported from the Worker's main module.
export { SkiffContainer, SkiffWorkerContainer };
export type { Env, InstanceReport };

/** Which kind of answer a path gets; `null` is a 404 from the Worker itself. */
export type Route = "health" | "skiff" | "basin" | "worker";

const SKIFF_PATHS = new Set(["/", "/query", "/streaming-query", "/metrics"]);
// Basin SQL's route and its legacy R2 SQL name; clients only swap the base URL.
const BASIN_PATH = /^\/api\/v1\/accounts\/[^/]+\/(?:basin-sql|r2-sql)\/query\/[^/]+$/;

export function routeOf(pathname: string): Route | null {
  if (pathname === "/_health") return "health";
  // The worker pool's tunnel: coordinators' WebSockets to worker container <n>.
  if (pathname === "/_worker" || pathname.startsWith("/_worker/")) return "worker";
  if (SKIFF_PATHS.has(pathname)) return "skiff";
  if (BASIN_PATH.test(pathname)) return "basin";
  return null;
}

/**
 * Which container instance serves a request.
 *
 * Default: one named instance, "skiff". Every request reaches the same process, so its
 * catalog, metadata and Parquet footer caches stay warm; a cold start (2-3 s) happens only
 * after `sleepAfter` without requests.
 *
 * With SKIFF_INSTANCES = N > 1: a fixed pool "skiff-0" ... "skiff-{N-1}". The instance is
 * FNV-1a(value of the SKIFF_SHARD_HEADER header, default x-project-id) mod N, so one project
 * always lands on the same instance (its caches stay warm) while projects spread over the
 * pool. Requests without the header go to "skiff-0". Not random choice: that would split
 * every project's caches over all instances. Keep `max_instances` in wrangler.jsonc >= N.
 */
export function instanceName(headers: Headers, env: Pick<Env, "SKIFF_INSTANCES" | "SKIFF_SHARD_HEADER">): string {
  const n = poolSize(env.SKIFF_INSTANCES);
  if (n === 1) return "skiff";
  const key = headers.get(env.SKIFF_SHARD_HEADER || "x-project-id");
  if (key === null || key === "") return "skiff-0";
  return `skiff-${fnv1a32(key) % n}`;
}

/** SKIFF_INSTANCES as a pool size; anything but a positive integer means 1. */
export function poolSize(raw: string | undefined): number {
  if (!raw || !/^\s*\d+\s*$/.test(raw)) return 1;
  return Math.max(1, Number.parseInt(raw, 10));
}

/** 32-bit FNV-1a over the UTF-8 bytes: tiny, stable across deploys and runtimes. */
export function fnv1a32(s: string): number {
  let h = 0x811c9dc5;
  for (const b of new TextEncoder().encode(s)) {
    h ^= b;
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

// Durable Object location hints: the container runs near where its Durable Object is created.
const LOCATION_HINTS = new Set(["wnam", "enam", "sam", "weur", "eeur", "apac", "oc", "afr", "me"]);

/** The instance's stub, placed by SKIFF_LOCATION_HINT (near the bucket) when one is set. */
export function instanceStub(env: Env, name: string): DurableObjectStub<SkiffContainer> {
  return placed(env.SKIFF, env, name);
}

/** A worker container's stub (`worker-<n>`), placed as the coordinators are: near the bucket. */
export function workerStub(env: Env, n: number): DurableObjectStub<SkiffWorkerContainer> {
  return placed(env.SKIFF_WORKER!, env, `worker-${n}`);
}

function placed<T extends Rpc.DurableObjectBranded | undefined>(ns: DurableObjectNamespace<T>, env: Env, name: string): DurableObjectStub<T> {
  const hint = env.SKIFF_LOCATION_HINT;
  if (typeof hint === "string" && LOCATION_HINTS.has(hint)) {
    return ns.getByName(name, { locationHint: hint as DurableObjectLocationHint });
  }
  return ns.getByName(name);
}

/** The shortest SKIFF_WORKER_TOKEN accepted: it guards workers that run any plan they are sent. */
export const MIN_WORKER_TOKEN_LENGTH = 32;

/**
 * What keeps this deployment from serving, checked before a container is woken: skiff in a
 * container never falls back to a demo lake, so a missing catalog is a configuration error,
 * answered here with its cause rather than as a container that failed to start.
 */
export function configProblem(env: Env): string | null {
  const set = (k: string) => typeof env[k] === "string" && (env[k] as string).trim() !== "";
  if (!set("API_TOKEN")) return "API_TOKEN is not set: `wrangler secret put API_TOKEN`";
  if (!set("SKIFF_CATALOG_URI")) {
    return "SKIFF_CATALOG_URI is not set: skiff needs a catalog (vars.SKIFF_CATALOG_URI in wrangler.jsonc)";
  }
  for (const k of ["SKIFF_CATALOG_URI", "SKIFF_WAREHOUSE"]) {
    const v = env[k];
    if (typeof v === "string" && /<[A-Z_]+>/.test(v)) return `${k} still holds a placeholder: ${v}`;
  }
  if (set("SKIFF_LOCATION_HINT") && !LOCATION_HINTS.has(env.SKIFF_LOCATION_HINT!)) {
    return `SKIFF_LOCATION_HINT ${env.SKIFF_LOCATION_HINT} is not a location hint (${[...LOCATION_HINTS].join(", ")})`;
  }
  const rest = /^https?:\/\//.test(env.SKIFF_CATALOG_URI!);
  if (rest && !set("CF_API_TOKEN") && !set("SKIFF_CATALOG_TOKEN")) {
    return "CF_API_TOKEN is not set: a REST catalog needs a token (`wrangler secret put CF_API_TOKEN`)";
  }
  return poolProblem(env);
}

/** What keeps the worker pool from working; with none (SKIFF_WORKER_POOL "0" or unset) nothing is needed. */
function poolProblem(env: Env): string | null {
  const pool = workerPoolSize(env.SKIFF_WORKER_POOL);
  if (pool === null) return `SKIFF_WORKER_POOL ${String(env.SKIFF_WORKER_POOL)} is not a number of worker containers ("0": none)`;
  if (pool === 0) return null;
  const publicUrl = typeof env.SKIFF_PUBLIC_URL === "string" ? env.SKIFF_PUBLIC_URL.trim() : "";
  if (publicUrl === "") {
    return "SKIFF_PUBLIC_URL is not set: with SKIFF_WORKER_POOL > 0 coordinators reach their workers through the Worker's own URL (vars.SKIFF_PUBLIC_URL, like https://skiff.<subdomain>.workers.dev)";
  }
  try {
    workerUrls(publicUrl, pool);
  } catch (error) {
    return describe(error);
  }
  const tokens = splitTokens(env.SKIFF_WORKER_TOKEN);
  if (tokens.length === 0) {
    return "SKIFF_WORKER_TOKEN is not set: with SKIFF_WORKER_POOL > 0 coordinators and workers share it (`wrangler secret put SKIFF_WORKER_TOKEN`)";
  }
  if (tokens.some((t) => t.length < MIN_WORKER_TOKEN_LENGTH || /\s/.test(t))) {
    return `each SKIFF_WORKER_TOKEN must be at least ${MIN_WORKER_TOKEN_LENGTH} characters without spaces (\`openssl rand -hex 32\`)`;
  }
  const clients = splitTokens(env.API_TOKEN);
  if (tokens.some((t) => clients.includes(t))) {
    return "SKIFF_WORKER_TOKEN must differ from every API_TOKEN: a client's token must not open the workers";
  }
  if (!env.SKIFF_WORKER) return "the SKIFF_WORKER Durable Object binding is missing (wrangler.jsonc: durable_objects.bindings)";
  return null;
}

const encoder = new TextEncoder();

async function sha256(s: string): Promise<ArrayBuffer> {
  return crypto.subtle.digest("SHA-256", encoder.encode(s));
}

/** The tokens of a comma-separated list (API_TOKEN, SKIFF_WORKER_TOKEN), so a new one can be added before the old goes. */
function splitTokens(list: unknown): string[] {
  return (typeof list === "string" ? list : "").split(",").map((t) => t.trim()).filter((t) => t !== "");
}

/** Checks `Authorization: Bearer <token>` against API_TOKEN (comma-separated list); see bearerMatches. */
export function authorized(header: string | null, apiToken: string | undefined): Promise<boolean> {
  return bearerMatches(header, splitTokens(apiToken));
}

/**
 * Whether `Authorization: Bearer <token>` holds one of the accepted tokens. Digests are
 * compared with timingSafeEqual and every accepted token is tried, so timing reveals neither
 * the token nor which one matched. No accepted token means nobody gets in (fail closed).
 */
export async function bearerMatches(header: string | null, accepted: string[]): Promise<boolean> {
  accepted = accepted.filter((t) => t !== "");
  if (accepted.length === 0) return false;
  const match = /^\s*bearer\s+(\S+)\s*$/i.exec(header ?? "");
  if (!match) return false;
  const given = await sha256(match[1]!);
  let ok = false;
  for (const token of accepted) {
    // Equal-length digests: timingSafeEqual never throws and never short-circuits.
    ok = crypto.subtle.timingSafeEqual(given, await sha256(token)) || ok;
  }
  return ok;
}

// A client's request id is kept only if it is short and harmless in logs and headers.
const SANE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

export function requestIdFor(request: Request): string {
  const given = request.headers.get("x-request-id");
  return given !== null && SANE_REQUEST_ID.test(given) ? given : crypto.randomUUID();
}

/** An error answered by the Worker itself: skiff's JSON error shape, or Basin's envelope. */
function errorResponse(
  route: Route | null,
  status: number,
  code: { skiff: string; basin: number },
  message: string,
  requestId: string,
  extraHeaders: Record<string, string> = {},
): Response {
  const body =
    route === "basin"
      ? { success: false, errors: [{ code: code.basin, message }], messages: [], result: null }
      : { error: { code: code.skiff, message } };
  return Response.json(body, {
    status,
    headers: { "cache-control": "no-store", "x-request-id": requestId, ...extraHeaders },
  });
}

/** The container library's own failure, in skiff's error shape or Basin's envelope, with its cause. */
function containerUnavailable(route: Route, requestId: string, kind: string, text: string): Response {
  if (kind === "rate_limited") {
    return errorResponse(route, 429, { skiff: "overloaded", basin: 42900 }, `overloaded: ${text}; retry later`, requestId, {
      "retry-after": "1",
    });
  }
  const why =
    kind === "no_instance"
      ? "no container instance is free (max_instances reached, or the container is still being provisioned)"
      : kind === "start_failed"
        ? `skiff's container could not start (${text.replace(/^Failed to start container:\s*/i, "").slice(0, 300)}); its log says why`
        : kind === "connection_lost"
          ? "the connection to skiff's container was lost (it may have restarted)"
          : kind === "restarting"
            ? "skiff's container is restarting to take new settings"
            : `skiff's container is unavailable: ${text}`;
  // A cold start takes a few seconds.
  return errorResponse(route, 503, { skiff: "unavailable", basin: 80001 }, `${why}; retry shortly`, requestId, {
    "retry-after": "5",
  });
}

/** One structured line per request, for Workers Logs. */
function logRequest(fields: Record<string, unknown>): void {
  console.log(JSON.stringify({ event: "request", ...fields }));
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const started = Date.now();
    const requestId = requestIdFor(request);
    const url = new URL(request.url);
    const route = routeOf(url.pathname);
    let instance: string | null = null;
    let res: Response;
    try {
      res = await handle(request, env, url, route, requestId, (name) => (instance = name));
    } catch (error) {
      console.error(JSON.stringify({ event: "worker_error", request_id: requestId, error: describe(error) }));
      res = errorResponse(route, 500, { skiff: "internal", basin: 10001 }, "internal error in the Worker", requestId);
    }
    logRequest({
      route: route ?? "unmatched",
      method: request.method,
      path: url.pathname,
      status: res.status,
      // Until the response head: a streamed body goes on after this line.
      duration_ms: Date.now() - started,
      request_id: requestId,
      instance,
    });
    return res;
  },
} satisfies ExportedHandler<Env>;

async function handle(
  request: Request,
  env: Env,
  url: URL,
  route: Route | null,
  requestId: string,
  chose: (instance: string) => void,
): Promise<Response> {
  if (route === null) {
    return errorResponse(null, 404, { skiff: "not_found", basin: 40004 }, `not found: ${url.pathname}`, requestId);
  }

  const problem = configProblem(env);
  if (route === "health" && !url.searchParams.has("deep")) {
    // The Worker's own health: never touches (and so never wakes or bills) a container.
    return Response.json(problem ? { status: "misconfigured", problem } : { status: "ok" }, {
      status: problem ? 500 : 200,
      headers: { "cache-control": "no-store", "x-request-id": requestId },
    });
  }
  if (problem) {
    console.error(JSON.stringify({ event: "skiff_misconfigured", request_id: requestId, problem }));
    return errorResponse(route, 500, { skiff: "not_configured", basin: 10001 }, `skiff is not configured: ${problem}`, requestId);
  }

  if (route === "worker") return tunnel(request, env, url, requestId, chose);

  // Auth before the container is touched: an unauthenticated caller must not wake (and bill) it.
  if (!(await authorized(request.headers.get("authorization"), env.API_TOKEN))) {
    return errorResponse(route, 401, { skiff: "unauthorized", basin: 10000 }, "missing or invalid bearer token", requestId, {
      "www-authenticate": 'Bearer realm="skiff"',
    });
  }

  const name = instanceName(request.headers, env);
  chose(name);
  const stub = instanceStub(env, name);

  if (route === "health") {
    // Deep health, for operators: the instance's container as it is, not started by this call.
    let report: InstanceReport;
    try {
      report = await stub.report();
    } catch (error) {
      return errorResponse(route, 503, { skiff: "unavailable", basin: 80001 }, `instance ${name}: ${describe(error)}`, requestId, {
        "retry-after": "5",
      });
    }
    const skiffOk = report.skiff !== null && "status" in report.skiff && report.skiff.status === 200;
    const status = !report.running || skiffOk ? 200 : 503;
    return Response.json(
      { status: report.running ? (skiffOk ? "ok" : "not_ready") : "sleeping", instance: name, ...report },
      { status, headers: { "cache-control": "no-store", "x-request-id": requestId } },
    );
  }

  const headers = new Headers(request.headers);
  headers.set("x-request-id", requestId);
  // @cloudflare/containers reads this header to pick the container port: clients must not.
  headers.delete("cf-container-target-port");
  // The body stays a stream: never buffered here, whatever its size.
  const forwarded = new Request(request.url, {
    method: request.method,
    headers,
    body: request.body,
    redirect: "manual",
  });

  let res: Response;
  try {
    res = await stub.fetch(forwarded);
  } catch (error) {
    console.error(JSON.stringify({ event: "skiff_forward_failed", instance: name, request_id: requestId, error: describe(error) }));
    return containerUnavailable(route, requestId, "unavailable", describe(error));
  }
  const failure = await containerFailure(res);
  if (failure) {
    console.error(
      JSON.stringify({ event: "skiff_container_unavailable", instance: name, request_id: requestId, status: res.status, kind: failure.kind }),
    );
    return containerUnavailable(route, requestId, failure.kind, failure.text.trim());
  }

  // Re-wrap only to make the headers mutable: the body (an Arrow stream, say) passes through as is.
  const out = new Response(res.body, res);
  out.headers.set("x-request-id", requestId);
  return out;
}

/** A worker's index in `/_worker/<n>` (canonical decimal), or null. */
function workerIndex(pathname: string): number | null {
  const m = /^\/_worker\/(0|[1-9][0-9]{0,8})$/.exec(pathname);
  return m ? Number(m[1]) : null;
}

/**
 * `/_worker/<n>`: a coordinator's WebSocket to worker container n, which carries its gRPC
 * (HTTP/2) connection. Only the pool's token opens it (a client's API_TOKEN must not reach a
 * worker, which runs any plan it is sent); checked before a container is touched. The upgrade
 * goes to the worker's Durable Object unchanged: the library proxies WebSockets from inside it.
 */
async function tunnel(
  request: Request,
  env: Env,
  url: URL,
  requestId: string,
  chose: (instance: string) => void,
): Promise<Response> {
  const route: Route = "worker";
  const notFound = () => errorResponse(route, 404, { skiff: "not_found", basin: 40004 }, `not found: ${url.pathname}`, requestId);
  const pool = workerPoolSize(env.SKIFF_WORKER_POOL) ?? 0;
  // Without a pool the route does not exist.
  if (pool === 0) return notFound();
  // Every token of the list, as skiff's workers accept them (coordinators send the first).
  if (!(await bearerMatches(request.headers.get("authorization"), splitTokens(env.SKIFF_WORKER_TOKEN)))) {
    return errorResponse(route, 401, { skiff: "unauthorized", basin: 10000 }, "missing or invalid bearer token", requestId, {
      "www-authenticate": 'Bearer realm="skiff-worker"',
    });
  }
  const n = workerIndex(url.pathname);
  if (n === null || n >= pool) return notFound();
  if (request.method !== "GET" || request.headers.get("upgrade")?.toLowerCase() !== "websocket") {
    return errorResponse(
      route,
      426,
      { skiff: "upgrade_required", basin: 40000 },
      "/_worker/<n> carries a WebSocket: GET with Upgrade: websocket",
      requestId,
      { upgrade: "websocket" },
    );
  }
  chose(`worker-${n}`);
  let res: Response;
  try {
    res = await workerStub(env, n).fetch(request);
  } catch (error) {
    console.error(JSON.stringify({ event: "skiff_worker_forward_failed", instance: `worker-${n}`, request_id: requestId, error: describe(error) }));
    return containerUnavailable(route, requestId, "unavailable", describe(error));
  }
  // The 101 and its WebSocket as they are.
  if (res.status === 101) return res;
  const failure = await containerFailure(res);
  if (failure) {
    console.error(
      JSON.stringify({ event: "skiff_worker_unavailable", instance: `worker-${n}`, request_id: requestId, status: res.status, kind: failure.kind }),
    );
    return containerUnavailable(route, requestId, failure.kind, failure.text.trim());
  }
  return res;
}
