import { SkiffContainer } from "./container";
import type { Env } from "./env";

// The Durable Object class must be exported from the Worker's main module.
export { SkiffContainer };
export type { Env };

/** Which kind of answer a path gets; `null` is a 404 from the Worker itself. */
export type Route = "health" | "skiff" | "basin";

const SKIFF_PATHS = new Set(["/", "/query", "/streaming-query", "/metrics"]);
// Basin SQL's route and its legacy R2 SQL name; clients only swap the base URL.
const BASIN_PATH = /^\/api\/v1\/accounts\/[^/]+\/(?:basin-sql|r2-sql)\/query\/[^/]+$/;

export function routeOf(pathname: string): Route | null {
  if (pathname === "/_health") return "health";
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

const encoder = new TextEncoder();

async function sha256(s: string): Promise<ArrayBuffer> {
  return crypto.subtle.digest("SHA-256", encoder.encode(s));
}

/**
 * Checks `Authorization: Bearer <token>` against API_TOKEN (comma-separated list). Digests are
 * compared with timingSafeEqual and every configured token is tried, so timing reveals neither
 * the token nor which one matched. No API_TOKEN means nobody gets in (fail closed).
 */
export async function authorized(header: string | null, apiToken: string | undefined): Promise<boolean> {
  const accepted = (apiToken ?? "").split(",").map((t) => t.trim()).filter((t) => t !== "");
  if (accepted.length === 0) {
    console.error(JSON.stringify({ event: "skiff_auth_misconfigured", message: "API_TOKEN is not set" }));
    return false;
  }
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

function unavailable(route: Route, requestId: string): Response {
  return errorResponse(
    route,
    503,
    { skiff: "unavailable", basin: 80001 },
    "skiff is starting or unavailable, retry shortly",
    requestId,
    // A cold start takes a few seconds.
    { "retry-after": "5" },
  );
}

// @cloudflare/containers answers its own failures (start failed, no instance free, connection
// lost) as text/plain 500/503 responses instead of throwing; these are their opening words.
const CONTAINER_FAILURES = [
  "Failed to start container",
  "There is no Container instance available",
  "Container suddenly disconnected",
  "Error proxying request to container",
];

/** True when the response comes from the container library failing, not from skiff. */
export async function isContainerFailure(res: Response): Promise<boolean> {
  if (res.status !== 500 && res.status !== 503) return false;
  if (!(res.headers.get("content-type") ?? "").startsWith("text/plain")) return false;
  // Only small plain-text error bodies get here, never a query result; read a copy.
  const text = await res.clone().text();
  return CONTAINER_FAILURES.some((prefix) => text.startsWith(prefix));
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const requestId = requestIdFor(request);
    const url = new URL(request.url);
    const route = routeOf(url.pathname);
    if (route === null) {
      return errorResponse(null, 404, { skiff: "not_found", basin: 40004 }, `not found: ${url.pathname}`, requestId);
    }

    // Auth before the container is touched: an unauthenticated caller must not wake (and bill) it.
    if (route !== "health" && !(await authorized(request.headers.get("authorization"), env.API_TOKEN))) {
      return errorResponse(
        route,
        401,
        { skiff: "unauthorized", basin: 10000 },
        "missing or invalid bearer token",
        requestId,
        { "www-authenticate": 'Bearer realm="skiff"' },
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

    const name = instanceName(request.headers, env);
    let res: Response;
    try {
      res = await env.SKIFF.getByName(name).fetch(forwarded);
    } catch (error) {
      console.error(
        JSON.stringify({ event: "skiff_forward_failed", instance: name, requestId, error: String(error) }),
      );
      return unavailable(route, requestId);
    }
    if (await isContainerFailure(res)) {
      console.error(JSON.stringify({ event: "skiff_container_unavailable", instance: name, requestId, status: res.status }));
      return unavailable(route, requestId);
    }

    // Re-wrap only to make the headers mutable: the body (an Arrow stream, say) passes through as is.
    const out = new Response(res.body, res);
    out.headers.set("x-request-id", requestId);
    return out;
  },
} satisfies ExportedHandler<Env>;
