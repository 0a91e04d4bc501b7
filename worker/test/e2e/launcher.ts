// TEST-ONLY, runs in Node (the vitest config binds it as the LAUNCHER service): what Cloudflare's
// container runtime does for a Durable Object's `ctx.container`, with the real skiff binary as
// the container's process. `start` runs SKIFF_BIN with the environment the Container class gave
// (its port 8080 moved to a free 127.0.0.1 port, the only change), `wait` resolves when the
// process exits, `signal` signals it, `info` tells what it was started with.
//
//   POST /start  {id, env}      -> {port}
//   POST /wait   {id}           -> {code}          (when the process has exited)
//   POST /signal {id, signo}    -> {}
//   GET  /info?id=              -> {starts, env, port, running, log}
import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";

interface Proc {
  child: ChildProcess;
  port: number;
  env: Record<string, string>;
  exited: Promise<number>;
  running: boolean;
  log: string[];
}

const procs = new Map<string, Proc>();
const starts = new Map<string, number>();

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

// Every process this launcher started ends with the test run.
process.on("exit", () => {
  for (const p of procs.values()) if (p.running) p.child.kill("SIGKILL");
});

export async function launcher(request: Request): Promise<Response> {
  const url = new URL(request.url);
  const bin = process.env.SKIFF_BIN;
  if (!bin) return Response.json({ error: "set SKIFF_BIN to the skiff binary" }, { status: 500 });
  switch (url.pathname) {
    case "/start": {
      const { id, env } = (await request.json()) as { id: string; env: Record<string, string> };
      if (procs.get(id)?.running) return Response.json({ error: "already running" }, { status: 409 });
      if (env.SKIFF_HTTP_ADDR !== "0.0.0.0:8080") {
        return Response.json({ error: `the container must listen on 0.0.0.0:8080, not ${env.SKIFF_HTTP_ADDR}` }, { status: 400 });
      }
      const port = await freePort();
      // Only the container's environment, as in a container (PATH for the process itself).
      const child = spawn(bin, ["serve"], {
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...env, SKIFF_HTTP_ADDR: `127.0.0.1:${port}` },
        stdio: ["ignore", "ignore", "pipe"],
      });
      const proc: Proc = { child, port, env, running: true, log: [], exited: Promise.resolve(0) };
      proc.exited = new Promise((resolve) =>
        child.on("exit", (code, signal) => {
          proc.running = false;
          resolve(code ?? (signal ? 128 : 1));
        }),
      );
      child.stderr!.setEncoding("utf8");
      let partial = "";
      child.stderr!.on("data", (chunk: string) => {
        const lines = (partial + chunk).split("\n");
        partial = lines.pop() ?? "";
        proc.log.push(...lines);
      });
      // The test run does not wait for these processes (the tests stop them; exit kills the rest).
      child.unref();
      procs.set(id, proc);
      starts.set(id, (starts.get(id) ?? 0) + 1);
      return Response.json({ port });
    }
    case "/wait": {
      const { id } = (await request.json()) as { id: string };
      const p = procs.get(id);
      if (!p) return Response.json({ error: "never started" }, { status: 404 });
      return Response.json({ code: await p.exited });
    }
    case "/signal": {
      const { id, signo } = (await request.json()) as { id: string; signo: number };
      procs.get(id)?.child.kill(signo);
      return Response.json({});
    }
    case "/info": {
      const id = url.searchParams.get("id") ?? "";
      const p = procs.get(id);
      return Response.json({ starts: starts.get(id) ?? 0, env: p?.env ?? null, port: p?.port ?? null, running: p?.running ?? false, log: p?.log ?? [] });
    }
  }
  return new Response("not found", { status: 404 });
}
