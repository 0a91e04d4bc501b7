// TEST-ONLY stand-in for SkiffContainer used by the e2e tests: instead of a container's port
// 8080 it forwards to a real skiff process at SKIFF_URL (e.g. http://127.0.0.1:PORT), the same
// way @cloudflare/containers forwards (same method, headers, streamed body; response as is).
// The Worker's code is the production code, unchanged: only the SKIFF binding differs.
import { DurableObject } from "cloudflare:workers";

interface E2EEnv {
  SKIFF_URL: string;
}

export class LocalSkiff extends DurableObject<E2EEnv> {
  override async fetch(request: Request): Promise<Response> {
    const base = new URL(this.env.SKIFF_URL);
    const target = new URL(request.url);
    target.protocol = base.protocol;
    target.host = base.host;
    const res = await fetch(new Request(target, request));
    // Marks answers that came from skiff, so a test can tell them from the Worker's own.
    const out = new Response(res.body, res);
    out.headers.set("x-e2e-via", "local-skiff");
    return out;
  }
}
