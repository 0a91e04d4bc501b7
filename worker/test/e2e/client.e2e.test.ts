// The typed client (src/client.ts) as another Worker uses it: over a service binding to the skiff
// Worker (here the loopback binding to this Worker's entry point, `exports.default`), the skiff
// Worker forwarding to a real skiff.
import { env, exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { SkiffClient, SkiffError } from "../../src/client";

const e = env as unknown as { SKIFF_URL: string; SKIFF_TEST_TOKEN: string };

function client(extra: Partial<ConstructorParameters<typeof SkiffClient>[0]> = {}): SkiffClient {
  return new SkiffClient({ service: exports.default, token: e.SKIFF_TEST_TOKEN, ...extra });
}

async function direct(sql: string): Promise<unknown[]> {
  const r = await fetch(new URL("/query", e.SKIFF_URL), {
    method: "POST",
    headers: { authorization: `Bearer ${e.SKIFF_TEST_TOKEN}` },
    body: JSON.stringify({ query: sql }),
  });
  expect(r.status).toBe(200);
  return (await r.json()) as unknown[];
}

async function rejection(p: Promise<unknown>): Promise<SkiffError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(SkiffError);
    return err as SkiffError;
  }
  throw new Error("expected a failure");
}

describe("SkiffClient over a service binding", () => {
  const top = "SELECT event, count(*) AS n FROM glass.events GROUP BY event ORDER BY n DESC, event LIMIT 5";

  it("query(): skiff's /query rows, typed", async () => {
    const rows = await client().query<{ event: string; n: number }>(top);
    expect(rows.length).toBe(5);
    expect(typeof rows[0]!.event).toBe("string");
    expect(rows).toEqual(await direct(top));
  });

  it("basin(): Basin's envelope, one physical table per name", async () => {
    const v1 = await client().basin<{ n: number }>("SELECT count(*) AS n FROM glass.events");
    expect(v1.schema).toEqual([{ name: "n", type: "Int64" }]);
    const v2 = await client().basinRows<{ n: number }>("SELECT count(*) AS n FROM glass.events_v2");
    const [all] = (await direct("SELECT count(*) AS n FROM glass.events")) as { n: number }[];
    expect(v1.rows[0]!.n + v2[0]!.n).toBe(all!.n);
    expect(v1.metrics?.files_scanned).toBeGreaterThanOrEqual(0);
  });

  it("basin() with expandVersions reads names as /query does", async () => {
    expect(await client({ expandVersions: true }).basinRows(top)).toEqual(await direct(top));
  });

  it("streamingQuery(): the Arrow stream, as skiff sends it", async () => {
    const res = await client().streamingQuery("SELECT 1 AS one");
    expect(res.headers.get("content-type")).toBe("application/vnd.apache.arrow.stream");
    const viaClient = new Uint8Array(await res.arrayBuffer());
    const d = await fetch(new URL("/streaming-query", e.SKIFF_URL), {
      method: "POST",
      headers: { authorization: `Bearer ${e.SKIFF_TEST_TOKEN}` },
      body: JSON.stringify({ query: "SELECT 1 AS one" }),
    });
    expect(viaClient).toEqual(new Uint8Array(await d.arrayBuffer()));
  });

  it("failures carry skiff's code, status and request id, in either shape", async () => {
    let err = await rejection(client().query("SELECT * FROM glass.no_such_table"));
    expect([err.status, err.code]).toEqual([404, "table_not_found"]);
    expect(err.requestId).toBeTruthy();
    err = await rejection(client().basin("SELECT * FROM glass.no_such_table"));
    expect([err.status, err.code]).toEqual([400, 40010]);
    err = await rejection(client().query("SELEC 1"));
    expect([err.status, err.code, err.attempts]).toEqual([400, "sql_syntax_error", 1]);
    err = await rejection(client({ token: "wrong" }).query("SELECT 1"));
    expect([err.status, err.code]).toEqual([401, "unauthorized"]);
  });
});
