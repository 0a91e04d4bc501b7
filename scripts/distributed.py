#!/usr/bin/env python3
"""Distributed skiff by hand: one coordinator and 0, 1, 2, 4 workers, each process in a cgroup
of one CPU (so that each worker added adds a CPU's worth of quota), over one lake.

For each cluster size it runs the Worker's query kinds (`shared/bench/queries`, `tests/queries`)
and prints, per kind, the warm median time; for the run, the bytes that crossed loopback between
the processes (the coordinator's answers to this script are small next to them) and each
process's peak resident memory. With `--tpch` the lake is a TPC-H one and
`shared/bench/tpch.py` runs its 22 queries (against DuckDB too). With `--tunnel` the
coordinator reaches each worker through its WebSocket tunnel (`ws://`), as on Cloudflare. The
results table in docs/distributed.md is this script's output.

    sudo scripts/distributed.py --skiff target/release/skiff --lake ~/lakes/lake-3m --workers 0,1,2,4
    sudo scripts/distributed.py --skiff target/release/skiff --lake ~/lakes/tpch-sf1 --tpch --workers 0,2
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sizing import GIB, SHARED, TOKEN, Cgroup, free_port, post, queries  # noqa: E402


def loopback_bytes():
    for line in open("/proc/net/dev"):
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    return 0


def wait_port(port, proc, what):
    import socket

    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} did not listen")


def wait_ready(base, proc):
    # It listens at once and answers 503 until the catalog is read.
    import urllib.request

    for _ in range(1200):
        if proc.poll() is not None:
            sys.exit("the coordinator exited")
        try:
            with urllib.request.urlopen(base + "/_health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("the coordinator was not ready")


class Cluster:
    def __init__(self, args, n, logdir):
        self.procs, self.groups = [], []
        env = dict(os.environ, RUST_LOG="warn", API_TOKEN=TOKEN, SKIFF_RESULT_CACHE_BYTES="0",
                   SKIFF_MEMORY_LIMIT=str(int(args.memory_gib * GIB * 0.6)), SKIFF_WORKER_TOKEN=TOKEN)
        urls = []
        for i in range(n):
            port, tunnel = free_port(), free_port()
            group = Cgroup(f"skiff-dist-w{i}", 1, int(args.memory_gib * GIB))
            cmd = [args.skiff, "worker", "--listen", f"127.0.0.1:{port}"]
            if args.tunnel:
                cmd += ["--tunnel", f"127.0.0.1:{tunnel}"]
            p = self.spawn(group, cmd, env, os.path.join(logdir, f"worker{i}.log"))
            wait_port(tunnel if args.tunnel else port, p, f"worker {i}")
            urls.append(f"ws://127.0.0.1:{tunnel}/_worker/{i}" if args.tunnel else f"http://127.0.0.1:{port}")
        self.port = free_port()
        group = Cgroup("skiff-dist-coordinator", 1, int(args.memory_gib * GIB))
        cmd = [args.skiff, "serve", "--catalog-uri", f"sqlite://{args.lake}/catalog.db", "--warehouse",
               f"{args.lake}/warehouse", "--http-addr", f"127.0.0.1:{self.port}", "--flight-addr", "off",
               "--query-timeout", "10m"]
        if urls:
            # In its cgroup of one CPU the coordinator plans one partition per worker by itself.
            cmd += ["--workers", ",".join(urls)]
        p = self.spawn(group, cmd, env, os.path.join(logdir, "coordinator.log"))
        self.base = f"http://127.0.0.1:{self.port}"
        wait_ready(self.base, p)

    def spawn(self, group, cmd, env, log):
        # The child joins its cgroup before it runs skiff, so every thread it starts is in it.
        files = group.procs_files()
        def join():
            for f in files:
                with open(f, "w") as fh:
                    fh.write(str(os.getpid()))
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"), preexec_fn=join)
        self.procs.append(p)
        self.groups.append(group)
        return p

    def peaks(self):
        # Peak resident memory of each process (a cgroup's peak also counts the page cache).
        out = []
        for p in self.procs:
            hwm = [l for l in open(f"/proc/{p.pid}/status") if l.startswith("VmHWM:")]
            out.append(int(hwm[0].split()[1]) << 10 if hwm else 0)
        return out

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait()
        for g in self.groups:
            g.remove()


def run(args, n, logdir):
    cluster = Cluster(args, n, logdir)
    try:
        times, tpch = {}, None
        before = loopback_bytes()
        if args.tpch:
            out = subprocess.run([sys.executable, os.path.join(SHARED, "bench/tpch.py"), "run", "--lake", args.lake,
                                  "--url", cluster.base, "--reps", str(args.reps), "--token", TOKEN],
                                 capture_output=True, text=True)
            tpch = out.stdout.strip().splitlines()[-1] if out.returncode == 0 else "failed: " + out.stderr[-500:]
        else:
            for name, sql in queries():
                status = post(cluster.base, sql, 600)[1]
                if status != 200:
                    sys.exit(f"{name} answered {status} with {n} workers")
                times[name] = statistics.median(post(cluster.base, sql, 600)[0] for _ in range(args.reps))
        moved = loopback_bytes() - before
        return times, moved, cluster.peaks(), tpch
    finally:
        cluster.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skiff", required=True)
    ap.add_argument("--lake", required=True, help="a folder with catalog.db and warehouse/")
    ap.add_argument("--workers", default="0,1,2,4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--memory-gib", type=float, default=6.0, help="each process's memory (cgroup)")
    ap.add_argument("--tpch", action="store_true", help="--lake is a TPC-H lake: run shared/bench/tpch.py on it")
    ap.add_argument("--tunnel", action="store_true", help="reach the workers through their WebSocket tunnels")
    args = ap.parse_args()
    sizes = [int(n) for n in args.workers.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as logdir:
        for n in sizes:
            results[n] = run(args, n, logdir)
            print(f"{n} workers done", file=sys.stderr)
    print(f"lake {args.lake}, {args.reps} runs each, workers reached {'through tunnels' if args.tunnel else 'over TCP'}")
    kinds = list(results[sizes[0]][0])
    print("| kind | " + " | ".join(f"{n} workers" if n else "one process" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for k in kinds:
        print(f"| {k} | " + " | ".join(f"{results[n][0][k]:.2f}" for n in sizes) + " |")
    if kinds:
        total = {n: sum(results[n][0].values()) for n in sizes}
        print("| **sum** | " + " | ".join(f"**{total[n]:.2f}**" for n in sizes) + " |")
    print("| loopback MB (whole run) | " + " | ".join(f"{results[n][1] / 1e6:.0f}" for n in sizes) + " |")
    print("| peak MiB: coordinator; workers | " + " | ".join(
        "; ".join(str((p or 0) >> 20) for p in [results[n][2][-1]] + results[n][2][:-1]) for n in sizes) + " |")
    for n in sizes:
        if results[n][3]:
            print(f"\nTPC-H with {n} workers: {results[n][3]}")
    print(json.dumps({"machine": os.uname().nodename, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))


if __name__ == "__main__":
    main()
