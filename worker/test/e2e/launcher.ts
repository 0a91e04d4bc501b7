// TEST-ONLY, runs in Node (the vitest config binds it as the LAUNCHER service): what Cloudflare's
// container runtime does for a Durable Object's `ctx.container`, with the real skiff binary as
// the container's process. `start` runs SKIFF_BIN as the image would: the Dockerfile's
// ENTRYPOINT and CMD, or the entrypoint the Container class gave in their place (its binary
// must be the image's), with the class's environment; the only change is that the listener on
// the container's port 8080 moves to a free 127.0.0.1 port, and so does a worker's loopback gRPC
// listener (a container's loopback is its own; here the host's is shared). `wait` resolves when
// the process exits, `signal` signals it, `info` tells what it was started with.
//
//   POST /start  {id, env, entrypoint?} -> {port}
//   POST /wait   {id}                   -> {code}          (when the process has exited)
//   POST /signal {id, signo}            -> {}
//   GET  /info?id=                      -> {starts, env, command, port, running, log}
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";

interface Proc {
  child: ChildProcess;
  port: number;
  env: Record<string, string>;
  /** The container's command: entrypoint and arguments, as the image or the class gave them. */
  command: string[];
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

/** The image's command: the Dockerfile's ENTRYPOINT followed by its CMD (both in exec form). */
function imageCommand(): { entrypoint: string[]; cmd: string[] } {
  const dockerfile = readFileSync(new URL("../../../Dockerfile", import.meta.url), "utf8");
  const form = (instruction: string): string[] => {
    const m = new RegExp(`^${instruction}\\s+(\\[.*\\])\\s*$`, "m").exec(dockerfile);
    if (!m) throw new Error(`the Dockerfile has no ${instruction} in exec form`);
    return JSON.parse(m[1]!) as string[];
  };
  return { entrypoint: form("ENTRYPOINT"), cmd: form("CMD") };
}

/** The setting whose listener is the container's port 8080, for each skiff command. */
const PORT_SETTING: Record<string, string> = { serve: "SKIFF_HTTP_ADDR", worker: "SKIFF_WORKER_TUNNEL_ADDR" };

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
      const given = (await request.json()) as { id: string; env: Record<string, string>; entrypoint?: string[] };
      const { id, env } = given;
      if (procs.get(id)?.running) return Response.json({ error: "already running" }, { status: 409 });
      // An entrypoint replaces the image's ENTRYPOINT and CMD, as in Docker.
      const image = imageCommand();
      const command = given.entrypoint ?? [...image.entrypoint, ...image.cmd];
      if (command[0] !== image.entrypoint[0]) {
        return Response.json({ error: `the image has no ${command[0]}: its binary is ${image.entrypoint[0]}` }, { status: 400 });
      }
      const args = command.slice(1);
      const setting = PORT_SETTING[args[0] ?? ""];
      if (!setting) return Response.json({ error: `skiff ${args.join(" ")} listens on no container port` }, { status: 400 });
      if (env[setting] !== "0.0.0.0:8080") {
        return Response.json({ error: `the container must listen on 0.0.0.0:8080 (${setting}), not ${env[setting]}` }, { status: 400 });
      }
      const port = await freePort();
      const moved: Record<string, string> = { [setting]: `127.0.0.1:${port}` };
      if (args[0] === "worker") {
        if (!/^127\.0\.0\.1:\d+$/.test(env.SKIFF_WORKER_ADDR ?? "")) {
          return Response.json({ error: `a worker's gRPC must stay on the container's loopback, not ${env.SKIFF_WORKER_ADDR}` }, { status: 400 });
        }
        moved.SKIFF_WORKER_ADDR = `127.0.0.1:${await freePort()}`;
      }
      // Only the container's environment, as in a container (PATH for the process itself).
      const child = spawn(bin, args, {
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...env, ...moved },
        stdio: ["ignore", "ignore", "pipe"],
      });
      const proc: Proc = { child, port, env, command, running: true, log: [], exited: Promise.resolve(0) };
      proc.exited = new Promise((resolve) => {
        child.on("exit", (code, signal) => {
          proc.running = false;
          resolve(code ?? (signal ? 128 : 1));
        });
        // A binary that cannot be run exits as a shell would (127), instead of ending the test run.
        child.on("error", (error) => {
          proc.running = false;
          proc.log.push(`launcher: ${error.message}`);
          resolve(127);
        });
      });
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
      return Response.json({
        starts: starts.get(id) ?? 0,
        env: p?.env ?? null,
        command: p?.command ?? null,
        port: p?.port ?? null,
        running: p?.running ?? false,
        log: p?.log ?? [],
      });
    }
  }
  return new Response("not found", { status: 404 });
}
