// The typed client's request shape and retries, against a scripted service binding (the e2e
// tests run it against a real skiff).
import { describe, expect, it } from "vitest";
import { SkiffClient, SkiffError } from "../../src/client";

function scripted(answers: Response[]) {
  const seen: Request[] = [];
  const service = {
    async fetch(request: Request): Promise<Response> {
      seen.push(request);
      return answers[Math.min(seen.length - 1, answers.length - 1)]!.clone();
    },
  };
  return { service, seen };
}

describe("SkiffClient", () => {
  it("posts {query} with the bearer token and extra headers; the Basin path and expansion header", async () => {
    const { service, seen } = scripted([Response.json([{ one: 1 }])]);
    const c = new SkiffClient({ service, token: "tok", headers: { "x-project-id": "p1" } });
    expect(await c.query("SELECT 1 AS one")).toEqual([{ one: 1 }]);
    const r = seen[0]!;
    expect(r.method).toBe("POST");
    expect(new URL(r.url).pathname).toBe("/query");
    expect(r.headers.get("authorization")).toBe("Bearer tok");
    expect(r.headers.get("x-project-id")).toBe("p1");
    expect(await r.json()).toEqual({ query: "SELECT 1 AS one" });

    const b = scripted([Response.json({ success: true, errors: [], messages: [], result: { schema: [], rows: [] } })]);
    const e = new SkiffClient({ service: b.service, token: "tok", accountId: "acc", bucket: "bkt", expandVersions: true });
    expect(await e.basinRows("SELECT 1")).toEqual([]);
    expect(new URL(b.seen[0]!.url).pathname).toBe("/api/v1/accounts/acc/basin-sql/query/bkt");
    expect(b.seen[0]!.headers.get("x-skiff-expand-versions")).toBe("true");
  });

  it("retries 503 and 429 honouring Retry-After, not 400, and gives up after maxAttempts", async () => {
    const sleeps: number[] = [];
    const sleep = async (ms: number) => void sleeps.push(ms);
    const busy = () => Response.json({ error: { code: "starting", message: "s" } }, { status: 503, headers: { "retry-after": "2" } });
    let s = scripted([busy(), new Response("x", { status: 429 }), Response.json([{ ok: true }])]);
    expect(await new SkiffClient({ service: s.service, token: "t", sleep }).query("q")).toEqual([{ ok: true }]);
    expect(sleeps).toEqual([2000, 1000]);

    s = scripted([busy()]);
    const err = await new SkiffClient({ service: s.service, token: "t", sleep, maxAttempts: 2 }).query("q").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SkiffError);
    expect([(err as SkiffError).status, (err as SkiffError).code, (err as SkiffError).attempts]).toEqual([503, "starting", 2]);

    s = scripted([Response.json({ error: { code: "invalid_query", message: "no" } }, { status: 400 })]);
    const bad = (await new SkiffClient({ service: s.service, token: "t", sleep }).query("q").catch((e: unknown) => e)) as SkiffError;
    expect([bad.status, bad.code, bad.attempts, s.seen.length]).toEqual([400, "invalid_query", 1, 1]);
  });
});
