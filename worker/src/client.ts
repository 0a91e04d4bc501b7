// A typed client for skiff, for another Worker to import and call skiff's Worker over a service
// binding (`services: [{ binding: "SKIFF", service: "skiff" }]` in its wrangler config), or over
// the network with a base URL. Only web APIs, so it runs in a Worker or in Node.
//
//   import { SkiffClient } from "skiff-worker/client";
//   const skiff = new SkiffClient({ service: env.SKIFF, token: env.SKIFF_TOKEN });
//   const rows = await skiff.query<{ event: string; n: number }>("SELECT event, count(*) AS n FROM glass.events GROUP BY 1");
//   const result = await skiff.basin("SELECT count(*) AS n FROM glass.events_v2");   // Basin SQL's envelope
//
// `query` (skiff's /query) reads `glass.events` as every version of the table; `basin` (the
// Basin SQL route) reads each name as one physical table, as Basin SQL does, unless
// `expandVersions` is set.

export type Row = Record<string, unknown>;

export interface BasinField {
  name: string;
  /** Arrow type name (`Int64`, `Utf8`, `Timestamp(Microsecond, None)`); nested types have `descriptor` instead. */
  type?: string;
  descriptor?: unknown;
}

export interface BasinResult<T extends Row = Row> {
  request_id?: string;
  schema: BasinField[];
  rows: T[];
  metrics?: { r2_requests_count?: number; files_scanned?: number; bytes_scanned?: number; [k: string]: unknown };
}

/** What `fetch` needs of a service binding. */
export interface SkiffService {
  fetch(request: Request): Promise<Response>;
}

export interface SkiffClientOptions {
  /** A service binding to skiff's Worker. Either this or `baseUrl`. */
  service?: SkiffService;
  /** skiff's base URL (`https://skiff.example.workers.dev`) when not over a service binding. */
  baseUrl?: string;
  /** A token from skiff's API_TOKEN list. */
  token: string;
  /** Path parts of the Basin route; skiff serves one lake and ignores them. */
  accountId?: string;
  bucket?: string;
  /** The Basin route reads `glass.events` as every version (as /query does) instead of one table. */
  expandVersions?: boolean;
  /** Extra headers on every request, e.g. `x-project-id` to pick a warm instance in a pool. */
  headers?: Record<string, string>;
  /** Attempts in all, the first included, for answers worth retrying (429, 503, Basin's 80001). Default 3. */
  maxAttempts?: number;
  /** Longest wait between attempts, whatever Retry-After asks. Default 10 s. */
  maxRetryDelayMs?: number;
  /** Per attempt. Default 60 s. */
  timeoutMs?: number;
  /** For tests: how to wait between attempts. */
  sleep?: (ms: number) => Promise<void>;
}

/** A failed call: skiff's error code (`invalid_query`, or Basin's number), status and message. */
export class SkiffError extends Error {
  override readonly name = "SkiffError";
  constructor(
    message: string,
    /** HTTP status of the last attempt; 0 when no response arrived. */
    readonly status: number,
    /** skiff's `error.code`, or Basin's `errors[0].code`. */
    readonly code: string | number | undefined,
    /** The request id skiff answered with (`x-request-id`), to find its log line. */
    readonly requestId: string | null,
    readonly attempts: number,
  ) {
    super(message);
  }
}

const RETRY_STATUSES = new Set([429, 503]);

export class SkiffClient {
  private readonly o: SkiffClientOptions & Required<Pick<SkiffClientOptions, "maxAttempts" | "maxRetryDelayMs" | "timeoutMs">>;

  constructor(options: SkiffClientOptions) {
    if (!options.service && !options.baseUrl) throw new Error("SkiffClient needs a service binding or a baseUrl");
    this.o = { maxAttempts: 3, maxRetryDelayMs: 10_000, timeoutMs: 60_000, ...options };
  }

  /** skiff's `/query`: the rows, as JSON objects. */
  async query<T extends Row = Row>(sql: string): Promise<T[]> {
    const { res, text, attempts } = await this.send("/query", sql);
    const body = parse(text);
    if (!res.ok) {
      const e = (body as { error?: { code?: string; message?: string } } | undefined)?.error;
      throw this.error(res, e?.message ?? text.slice(0, 500), e?.code, attempts);
    }
    if (!Array.isArray(body)) throw this.error(res, "skiff's /query did not answer a JSON array", undefined, attempts);
    return body as T[];
  }

  /** skiff's `/streaming-query`: the response, whose body is an Arrow IPC stream (schema first). */
  async streamingQuery(sql: string): Promise<Response> {
    const { res, text, attempts } = await this.send("/streaming-query", sql, true);
    if (!res.ok) {
      const e = (parse(text) as { error?: { code?: string; message?: string } } | undefined)?.error;
      throw this.error(res, e?.message ?? text.slice(0, 500), e?.code, attempts);
    }
    return res;
  }

  /** The Basin SQL route: Basin's `result` (schema, rows, metrics). */
  async basin<T extends Row = Row>(sql: string): Promise<BasinResult<T>> {
    const path = `/api/v1/accounts/${encodeURIComponent(this.o.accountId ?? "skiff")}/basin-sql/query/${encodeURIComponent(this.o.bucket ?? "lake")}`;
    const { res, text, attempts } = await this.send(path, sql);
    const env = parse(text) as { success?: boolean; errors?: { code: number; message: string }[]; result?: BasinResult<T> | null } | undefined;
    if (res.ok && env?.success === true) return env.result ?? { schema: [], rows: [] };
    const first = env?.errors?.[0];
    throw this.error(res, first?.message ?? text.slice(0, 500), first?.code, attempts);
  }

  /** The Basin route's rows. */
  async basinRows<T extends Row = Row>(sql: string): Promise<T[]> {
    return (await this.basin<T>(sql)).rows;
  }

  private error(res: Response, message: string, code: string | number | undefined, attempts: number): SkiffError {
    return new SkiffError(`skiff answered ${res.status}: ${message}`, res.status, code, res.headers.get("x-request-id"), attempts);
  }

  private async send(path: string, sql: string, stream = false): Promise<{ res: Response; text: string; attempts: number }> {
    const headers: Record<string, string> = {
      ...this.o.headers,
      authorization: `Bearer ${this.o.token}`,
      "content-type": "application/json",
    };
    if (this.o.expandVersions) headers["x-skiff-expand-versions"] = "true";
    const url = new URL(path, this.o.baseUrl ?? "https://skiff").toString();
    const body = JSON.stringify({ query: sql });
    for (let attempt = 1; ; attempt++) {
      let res: Response;
      try {
        const request = new Request(url, { method: "POST", headers, body, signal: AbortSignal.timeout(this.o.timeoutMs) });
        res = this.o.service ? await this.o.service.fetch(request) : await fetch(request);
      } catch (error) {
        throw new SkiffError(`skiff did not answer: ${error instanceof Error ? error.message : String(error)}`, 0, undefined, null, attempt);
      }
      // A streamed success is handed over unread.
      if (stream && res.ok) return { res, text: "", attempts: attempt };
      const text = await res.text();
      const retryable = RETRY_STATUSES.has(res.status) || /"code"\s*:\s*80001/.test(text);
      if (res.ok || !retryable || attempt >= this.o.maxAttempts) return { res, text, attempts: attempt };
      const asked = Number.parseInt(res.headers.get("retry-after") ?? "", 10);
      const delay = Math.min(this.o.maxRetryDelayMs, Number.isFinite(asked) ? asked * 1000 : 500 * 2 ** (attempt - 1));
      await (this.o.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms))))(delay);
    }
  }
}

function parse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
