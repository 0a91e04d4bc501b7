// A Basin SQL client written the way production Basin clients are written: plain `fetch`,
// retries with backoff on code 80001 and on HTTP 429/502/503/504 (bounded, honouring
// Retry-After), failure on `!res.ok || body.success === false`, messages from `errors[].message`.
// Only web APIs (fetch, AbortSignal, setTimeout), so the same code runs in a Worker or in Node.
// Also: `skiffQuery`, a call to skiff's own `/query`, to compare answers with.

export type Row = Record<string, unknown>;

export interface BasinApiError {
  code: number;
  message: string;
}

export interface BasinSchemaField {
  name: string;
  type?: string;
  descriptor?: unknown;
}

export interface BasinResult {
  request_id?: string;
  schema: BasinSchemaField[];
  rows: Row[];
  metrics?: { r2_requests_count?: number; files_scanned?: number; bytes_scanned?: number };
}

export interface BasinEnvelope {
  success: boolean;
  errors: BasinApiError[];
  messages?: unknown[];
  result: BasinResult | null;
}

/** Basin SQL's retryable error: edge connection failure. */
export const CODE_EDGE_CONNECTION_FAILURE = 80001;
/** HTTP statuses a Basin client retries. */
export const RETRY_STATUSES: ReadonlySet<number> = new Set([429, 502, 503, 504]);

export interface BasinClientOptions {
  /** Base URL, e.g. https://api.sql.cloudflarestorage.com (no trailing path). */
  baseUrl: string;
  accountId: string;
  bucket: string;
  token: string;
  /** Sent as `warehouse`; Basin's default is `${accountId}_${bucket}`. Set to null to omit. */
  warehouse?: string | null;
  /** `basin-sql` (current) or `r2-sql` (legacy path, still served). */
  route?: "basin-sql" | "r2-sql";
  /** Total attempts, first one included. Default 4. */
  maxAttempts?: number;
  /** First backoff delay; doubles per retry (with jitter). Default 250 ms. */
  baseDelayMs?: number;
  /** Upper bound on a backoff delay. Default 5 s. */
  maxDelayMs?: number;
  /** Upper bound on a delay asked for by Retry-After. Default 30 s. */
  maxRetryAfterMs?: number;
  /** Per-attempt timeout. Default 60 s. A timed-out query is not retried. */
  timeoutMs?: number;
  /** For tests: the fetch and sleep to use, and the jitter source (0..1). */
  fetch?: typeof fetch;
  sleep?: (ms: number) => Promise<void>;
  random?: () => number;
}

export class BasinSqlError extends Error {
  override readonly name = "BasinSqlError";
  constructor(
    message: string,
    /** HTTP status of the last attempt; 0 when no response arrived (network failure). */
    readonly status: number,
    /** `errors` of the last response ([] when there was no envelope). */
    readonly errors: BasinApiError[],
    /** How many requests were sent. */
    readonly attempts: number,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /** The first error code, if any. */
  get code(): number | undefined {
    return this.errors[0]?.code;
  }
}

const defaultSleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Retry-After as milliseconds: delta-seconds or an HTTP date; undefined when absent or unreadable. */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null) return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - now);
}

function isEnvelope(x: unknown): x is BasinEnvelope {
  return typeof x === "object" && x !== null && "success" in x;
}

function describeErrors(errors: BasinApiError[]): string {
  return errors.map((e) => (e.code !== undefined ? `${e.message} (code ${e.code})` : e.message)).join("; ");
}

export class BasinSqlClient {
  private readonly o: Required<Omit<BasinClientOptions, "warehouse">> & { warehouse: string | null };

  constructor(options: BasinClientOptions) {
    this.o = {
      route: "basin-sql",
      maxAttempts: 4,
      baseDelayMs: 250,
      maxDelayMs: 5_000,
      maxRetryAfterMs: 30_000,
      timeoutMs: 60_000,
      fetch: (input, init) => fetch(input, init),
      sleep: defaultSleep,
      random: Math.random,
      ...options,
      warehouse: options.warehouse === undefined ? `${options.accountId}_${options.bucket}` : options.warehouse,
    };
  }

  get url(): string {
    const { baseUrl, accountId, bucket, route } = this.o;
    return `${baseUrl.replace(/\/+$/, "")}/api/v1/accounts/${encodeURIComponent(accountId)}/${route}/query/${encodeURIComponent(bucket)}`;
  }

  /** Runs `sql` and returns its rows. */
  async query<T extends Row = Row>(sql: string): Promise<T[]> {
    return (await this.run(sql)).rows as T[];
  }

  /** Runs `sql` and returns the whole `result` (schema, rows, metrics). */
  async run(sql: string): Promise<BasinResult> {
    const body = JSON.stringify(this.o.warehouse === null ? { query: sql } : { query: sql, warehouse: this.o.warehouse });
    for (let attempt = 1; ; attempt++) {
      const last = attempt >= this.o.maxAttempts;
      let res: Response;
      try {
        res = await this.o.fetch(this.url, {
          method: "POST",
          headers: { authorization: `Bearer ${this.o.token}`, "content-type": "application/json", accept: "application/json" },
          body,
          signal: AbortSignal.timeout(this.o.timeoutMs),
        });
      } catch (err) {
        // A timeout is the query's own cost: running it again would only cost more.
        const timedOut = err instanceof Error && (err.name === "TimeoutError" || err.name === "AbortError");
        if (timedOut || last) {
          const why = err instanceof Error ? err.message : String(err);
          throw new BasinSqlError(`Basin SQL request failed after ${attempt} attempt(s): ${why}`, 0, [], attempt, { cause: err });
        }
        await this.o.sleep(this.backoff(attempt));
        continue;
      }

      const text = await res.text();
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = undefined;
      }
      const envelope = isEnvelope(parsed) ? parsed : undefined;
      const errors = Array.isArray(envelope?.errors) ? envelope.errors : [];

      if (res.ok && envelope?.success === true && envelope.result) {
        return envelope.result;
      }
      if (res.ok && envelope?.success === true) {
        return { schema: [], rows: [] };
      }

      const retryable =
        RETRY_STATUSES.has(res.status) || errors.some((e) => e.code === CODE_EDGE_CONNECTION_FAILURE);
      if (retryable && !last) {
        const asked = parseRetryAfter(res.headers.get("retry-after"));
        await this.o.sleep(asked !== undefined ? Math.min(asked, this.o.maxRetryAfterMs) : this.backoff(attempt));
        continue;
      }

      const detail =
        errors.length > 0
          ? describeErrors(errors)
          : envelope
            ? "success: false without errors"
            : `non-JSON response: ${text.slice(0, 200)}`;
      throw new BasinSqlError(`Basin SQL query failed (HTTP ${res.status}): ${detail}`, res.status, errors, attempt);
    }
  }

  /** Exponential backoff with full jitter, capped. */
  private backoff(attempt: number): number {
    const ceiling = Math.min(this.o.maxDelayMs, this.o.baseDelayMs * 2 ** (attempt - 1));
    return Math.round(ceiling * (0.5 + 0.5 * this.o.random()));
  }
}

export class SkiffQueryError extends Error {
  override readonly name = "SkiffQueryError";
  constructor(
    message: string,
    readonly status: number,
    readonly code: string | undefined,
  ) {
    super(message);
  }
}

/** skiff's own `/query`: `{"query": sql}` in, a JSON array of row objects out. */
export async function skiffQuery<T extends Row = Row>(
  baseUrl: string,
  token: string,
  sql: string,
  fetchImpl: typeof fetch = (input, init) => fetch(input, init),
): Promise<T[]> {
  const res = await fetchImpl(`${baseUrl.replace(/\/+$/, "")}/query`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json", accept: "application/json" },
    body: JSON.stringify({ query: sql }),
  });
  const text = await res.text();
  if (!res.ok) {
    let code: string | undefined;
    let message = text.slice(0, 500);
    try {
      const body = JSON.parse(text) as { error?: { code?: string; message?: string } };
      code = body.error?.code;
      message = body.error?.message ?? message;
    } catch {
      // not JSON: keep the text
    }
    throw new SkiffQueryError(`skiff /query failed (HTTP ${res.status}): ${message}`, res.status, code);
  }
  const rows: unknown = JSON.parse(text);
  if (!Array.isArray(rows)) throw new SkiffQueryError("skiff /query did not answer a JSON array", res.status, undefined);
  return rows as T[];
}
