// A production-style Basin SQL client (client.ts) against a running skiff, in plain Node.
// Needs SKIFF_URL (e.g. http://127.0.0.1:8080) and SKIFF_TEST_TOKEN; fails without them.
// Run: SKIFF_URL=... SKIFF_TEST_TOKEN=... npm run test:basin
//
// 1. Retry behaviour, against a scripted local HTTP server (no skiff needed).
// 2. Every analytics query in queries.ts: rows through the Basin route equal rows through /query.
// 3. Failures surface as Basin errors: 40003 syntax, 40004 invalid query, 40010 missing table.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { beforeAll, beforeEach, describe, expect, it } from "vitest";
import { BasinSqlClient, BasinSqlError, parseRetryAfter, skiffQuery, SkiffQueryError } from "./client";
import { expandVersions, type Columns } from "./expand";
import { QUERIES } from "./queries";

const SKIFF_URL = process.env.SKIFF_URL ?? "";
const SKIFF_TEST_TOKEN = process.env.SKIFF_TEST_TOKEN ?? "";

// ---------------------------------------------------------------------------------------------
// A scripted server: answers requests from a list of canned responses, records what it got.

interface Canned {
  status: number;
  body: unknown;
  headers?: Record<string, string>;
}

interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: string;
}

interface Scripted {
  url: string;
  seen: Seen[];
  close(): Promise<void>;
}

const ok = (rows: unknown[]): Canned => ({
  status: 200,
  body: {
    success: true,
    errors: [],
    messages: [],
    result: {
      request_id: "r1",
      schema: [{ name: "one", type: "Int64" }],
      rows,
      metrics: { r2_requests_count: 0, files_scanned: 0, bytes_scanned: 0 },
    },
  },
});

const fail = (status: number, code: number, message: string, headers?: Record<string, string>): Canned => ({
  status,
  body: { success: false, errors: [{ code, message }], messages: [], result: null },
  headers,
});

async function scripted(responses: Canned[]): Promise<Scripted> {
  const seen: Seen[] = [];
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body: Buffer.concat(chunks).toString() });
      const r = responses[Math.min(seen.length - 1, responses.length - 1)]!;
      const text = typeof r.body === "string" ? r.body : JSON.stringify(r.body);
      const type = typeof r.body === "string" ? "text/html" : "application/json";
      res.writeHead(r.status, { "content-type": type, ...r.headers });
      res.end(text);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** A client whose sleeps are recorded (and skipped) and whose jitter is fixed. */
function recordingClient(baseUrl: string, extra: Partial<ConstructorParameters<typeof BasinSqlClient>[0]> = {}) {
  const sleeps: number[] = [];
  const client = new BasinSqlClient({
    baseUrl,
    accountId: "acc123",
    bucket: "events-bucket",
    token: "tok",
    maxAttempts: 4,
    baseDelayMs: 100,
    maxDelayMs: 1_000,
    sleep: async (ms) => {
      sleeps.push(ms);
    },
    random: () => 1,
    ...extra,
  });
  return { client, sleeps };
}

async function caught(p: Promise<unknown>): Promise<BasinSqlError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(BasinSqlError);
    return e as BasinSqlError;
  }
  throw new Error("expected the query to fail");
}

describe("Basin client: request shape and retries (scripted server)", () => {
  it("POSTs {query, warehouse} with a bearer token to the basin-sql route", async () => {
    const s = await scripted([ok([{ one: 1 }])]);
    try {
      const { client } = recordingClient(s.url);
      expect(await client.query("SELECT 1 AS one")).toEqual([{ one: 1 }]);
      expect(s.seen).toHaveLength(1);
      const [req] = s.seen;
      expect(req!.method).toBe("POST");
      expect(req!.url).toBe("/api/v1/accounts/acc123/basin-sql/query/events-bucket");
      expect(req!.headers.authorization).toBe("Bearer tok");
      expect(req!.headers["content-type"]).toBe("application/json");
      expect(JSON.parse(req!.body)).toEqual({ query: "SELECT 1 AS one", warehouse: "acc123_events-bucket" });
    } finally {
      await s.close();
    }
  });

  it("retries 503 + 80001 once, honouring Retry-After, then returns the rows", async () => {
    const s = await scripted([
      fail(503, 80001, "edge connection failure", { "retry-after": "2" }),
      ok([{ one: 1 }]),
    ]);
    try {
      const { client, sleeps } = recordingClient(s.url);
      expect(await client.query("SELECT 1 AS one")).toEqual([{ one: 1 }]);
      expect(s.seen).toHaveLength(2);
      expect(sleeps).toEqual([2_000]); // Retry-After, not the 100 ms backoff
      expect(s.seen[1]!.body).toBe(s.seen[0]!.body);
    } finally {
      await s.close();
    }
  });

  it("really waits for Retry-After with the default sleep", async () => {
    const s = await scripted([fail(503, 80001, "edge connection failure", { "retry-after": "1" }), ok([{ one: 1 }])]);
    try {
      const client = new BasinSqlClient({ baseUrl: s.url, accountId: "a", bucket: "b", token: "tok" });
      const t0 = Date.now();
      expect(await client.query("SELECT 1 AS one")).toEqual([{ one: 1 }]);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(950);
      expect(s.seen).toHaveLength(2);
    } finally {
      await s.close();
    }
  });

  it("retries 429, 502 and 504 with exponential backoff", async () => {
    const s = await scripted([
      { status: 429, body: { success: false, errors: [{ code: 10429, message: "rate limited" }], result: null } },
      { status: 502, body: "<html>Bad Gateway</html>" },
      { status: 504, body: "<html>Gateway Timeout</html>" },
      ok([{ one: 1 }]),
    ]);
    try {
      const { client, sleeps } = recordingClient(s.url);
      expect(await client.query("SELECT 1 AS one")).toEqual([{ one: 1 }]);
      expect(s.seen).toHaveLength(4);
      expect(sleeps).toEqual([100, 200, 400]);
    } finally {
      await s.close();
    }
  });

  it("retries code 80001 whatever the HTTP status", async () => {
    const s = await scripted([fail(500, 80001, "edge connection failure"), ok([{ one: 1 }])]);
    try {
      const { client } = recordingClient(s.url);
      expect(await client.query("SELECT 1 AS one")).toEqual([{ one: 1 }]);
      expect(s.seen).toHaveLength(2);
    } finally {
      await s.close();
    }
  });

  it("gives up after maxAttempts and reports the last error", async () => {
    const s = await scripted([fail(503, 80001, "edge connection failure", { "retry-after": "0" })]);
    try {
      const { client, sleeps } = recordingClient(s.url, { maxAttempts: 3 });
      const err = await caught(client.query("SELECT 1 AS one"));
      expect(s.seen).toHaveLength(3);
      expect(sleeps).toEqual([0, 0]);
      expect(err.attempts).toBe(3);
      expect(err.status).toBe(503);
      expect(err.code).toBe(80001);
      expect(err.message).toContain("edge connection failure");
    } finally {
      await s.close();
    }
  });

  it("caps a huge Retry-After", async () => {
    const s = await scripted([fail(503, 80001, "later", { "retry-after": "3600" }), ok([])]);
    try {
      const { client, sleeps } = recordingClient(s.url, { maxRetryAfterMs: 1_500 });
      expect(await client.query("SELECT 1")).toEqual([]);
      expect(sleeps).toEqual([1_500]);
    } finally {
      await s.close();
    }
  });

  it("does not retry a 400 (40003) and surfaces errors[].message", async () => {
    const s = await scripted([fail(400, 40003, "SQL syntax error: Expected: an SQL statement, found: SELEC")]);
    try {
      const { client, sleeps } = recordingClient(s.url);
      const err = await caught(client.query("SELEC 1"));
      expect(s.seen).toHaveLength(1);
      expect(sleeps).toEqual([]);
      expect(err.code).toBe(40003);
      expect(err.status).toBe(400);
      expect(err.message).toContain("SQL syntax error");
    } finally {
      await s.close();
    }
  });

  it("treats HTTP 200 with success: false as a failure", async () => {
    const s = await scripted([fail(200, 40004, "unsupported feature")]);
    try {
      const { client } = recordingClient(s.url);
      const err = await caught(client.query("SELECT 1"));
      expect(s.seen).toHaveLength(1);
      expect(err.code).toBe(40004);
      expect(err.message).toContain("unsupported feature");
    } finally {
      await s.close();
    }
  });

  it("gives up on a closed port after maxAttempts network failures", async () => {
    // Take a free port, then close it: connections are refused.
    const s = await scripted([ok([])]);
    const url = s.url;
    await s.close();
    const { client, sleeps } = recordingClient(url, { maxAttempts: 3 });
    const err = await caught(client.query("SELECT 1"));
    expect(err.attempts).toBe(3);
    expect(err.status).toBe(0);
    expect(sleeps).toEqual([100, 200]);
    expect(err.message).toMatch(/failed after 3 attempt/);
  });

  it("parses Retry-After as seconds or an HTTP date", () => {
    expect(parseRetryAfter(null)).toBeUndefined();
    expect(parseRetryAfter("3")).toBe(3_000);
    expect(parseRetryAfter("soon")).toBeUndefined();
    const now = Date.parse("2026-10-01T00:00:00Z");
    expect(parseRetryAfter("Thu, 01 Oct 2026 00:00:05 GMT", now)).toBe(5_000);
  });
});

// ---------------------------------------------------------------------------------------------

function requireSkiff(): void {
  // Fail, not skip: a missing skiff must not look like a green run.
  if (!SKIFF_URL || !SKIFF_TEST_TOKEN) {
    throw new Error("set SKIFF_URL (e.g. http://127.0.0.1:8080) and SKIFF_TEST_TOKEN to run the Basin client tests");
  }
}

describe("Basin client against a real skiff", () => {
  const basin = () =>
    new BasinSqlClient({ baseUrl: SKIFF_URL, accountId: "acc123", bucket: "glass-lake", token: SKIFF_TEST_TOKEN });

  beforeAll(() => {
    requireSkiff();
  });
  beforeEach(() => {
    requireSkiff();
  });

  it("skiff is up", async () => {
    const res = await fetch(new URL("/_health", SKIFF_URL));
    expect(res.status).toBe(200);
    await res.body?.cancel();
  });

  // Basin's DESCRIBE of each version: what a Basin client expands glass.events with.
  const versions = async (): Promise<[string, Columns][]> => {
    const out: [string, Columns][] = [];
    for (const t of ["events", "events_v2"]) {
      const rows = await basin().query<{ column_name: string; data_type: string }>(`DESCRIBE glass.${t}`);
      out.push([t, rows.map((r) => ({ name: r.column_name, type: r.data_type }))]);
    }
    return out;
  };

  it("the Basin route reads glass.events as Basin does: one physical table", async () => {
    const [v1] = await basin().query<{ n: number }>("SELECT count(*) AS n FROM glass.events");
    const [v2] = await basin().query<{ n: number }>("SELECT count(*) AS n FROM glass.events_v2");
    const [all] = await skiffQuery<{ n: number }>(SKIFF_URL, SKIFF_TEST_TOKEN, "SELECT count(*) AS n FROM glass.events");
    expect(v1!.n + v2!.n).toBe(all!.n);
    expect(v1!.n).toBeGreaterThan(0);
    expect(v2!.n).toBeGreaterThan(0);
    const columns = (await basin().query<{ column_name: string }>("DESCRIBE glass.events")).map((c) => c.column_name);
    expect(columns).not.toContain("revenue");
  });

  for (const q of QUERIES) {
    it(`${q.kind}: ${q.name}: Basin route rows (SQL expanded as a Basin client does) equal /query rows`, async () => {
      // One at a time: the two calls must not compete for the (small) machine.
      const result = await basin().run(expandVersions(q.sql, "events", await versions()));
      const direct = await skiffQuery(SKIFF_URL, SKIFF_TEST_TOKEN, q.sql);
      expect(result.rows).toEqual(direct);
      expect(result.rows.length).toBeGreaterThanOrEqual(q.minRows);
      if (q.nonTrivial) expect(q.nonTrivial(result.rows), JSON.stringify(result.rows)).toBe(true);
      // The envelope's schema names the row keys, in order.
      expect(result.schema.map((f) => f.name)).toEqual(Object.keys(result.rows[0]!));
    });
  }

  it("the same query answers the same rows twice (results are deterministic)", async () => {
    const q = QUERIES.find((x) => x.name === "breakdown_purchase_amount_percentiles")!;
    expect(await basin().query(q.sql)).toEqual(await basin().query(q.sql));
  });

  it("the legacy r2-sql route answers the same rows", async () => {
    const q = QUERIES.find((x) => x.kind === "top events")!;
    const legacy = new BasinSqlClient({
      baseUrl: SKIFF_URL,
      accountId: "acc123",
      bucket: "glass-lake",
      token: SKIFF_TEST_TOKEN,
      route: "r2-sql",
      warehouse: null,
    });
    expect(await legacy.query(q.sql)).toEqual(await basin().query(q.sql));
  });

  it("a query with no rows gives an empty list", async () => {
    const rows = await basin().query("SELECT event FROM glass.events WHERE project_id = 'no_such_project'");
    expect(rows).toEqual([]);
  });

  it("a SQL syntax error surfaces errors[].message with code 40003, not retried", async () => {
    const err = await caught(basin().query("SELEC event FROM glass.events"));
    expect(err.status).toBe(400);
    expect(err.code).toBe(40003);
    expect(err.attempts).toBe(1);
    expect(err.errors[0]!.message).toMatch(/SELEC/);
    expect(err.message).toContain(err.errors[0]!.message);
  });

  it("an unknown table gives 40010", async () => {
    const err = await caught(basin().query("SELECT * FROM glass.no_such_table LIMIT 1"));
    expect(err.status).toBe(400);
    expect(err.code).toBe(40010);
    expect(err.attempts).toBe(1);
    expect(err.errors[0]!.message).toMatch(/no_such_table/);
    // /query reports the same failure in its own shape.
    const direct = await skiffQuery(SKIFF_URL, SKIFF_TEST_TOKEN, "SELECT * FROM glass.no_such_table LIMIT 1").then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(direct).toBeInstanceOf(SkiffQueryError);
    expect((direct as SkiffQueryError).status).toBeGreaterThanOrEqual(400);
  });

  it("an unknown column gives 40004", async () => {
    const err = await caught(basin().query("SELECT no_such_column FROM glass.events LIMIT 1"));
    expect(err.status).toBe(400);
    expect(err.code).toBe(40004);
    expect(err.errors[0]!.message).toMatch(/no_such_column/);
  });

  it("a wrong token fails without retries", async () => {
    const bad = new BasinSqlClient({ baseUrl: SKIFF_URL, accountId: "acc123", bucket: "glass-lake", token: "wrong-token" });
    const err = await caught(bad.query("SELECT 1 AS one"));
    expect([401, 403]).toContain(err.status);
    expect(err.attempts).toBe(1);
    expect(err.errors.length).toBeGreaterThan(0);
  });

  it.each([
    "CREATE TABLE bc_probe AS SELECT 1 AS one",
    "DROP TABLE IF EXISTS glass.bc_no_such_table",
  ])("a write is refused with 40004: %s", async (sql) => {
    // Harmless probes: even a broken read-only guard could not lose data with these.
    const err = await caught(basin().query(sql));
    expect(err.status).toBe(400);
    expect(err.code).toBe(40004);
    expect(err.attempts).toBe(1);
  });
});
