#!/usr/bin/env python3
"""Which Cloudflare Containers instance type serves which lake: skiff under the CPU and memory of
each instance type, the Worker's query kinds timed on each (run by hand; results in docs/sizing.md).

    sudo? no: run as root on a machine where cgroups can be made (this one: cgroup v1).
    scripts/sizing.py --skiff $CARGO_TARGET_DIR/release/skiff --lake /work/lakes/lake-3m \
        [--types basic,standard-1,standard-2,standard-3] [--reps 3] [--json out.json]

For each instance type, skiff runs in a cgroup of that size: cgroup v2 `cpu.max` and `memory.max`
where the machine has them, else cgroup v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us` and
`memory.limit_in_bytes` (the same limits under their v1 names: CFS bandwidth and the memory
controller's hard limit, no swap). Its memory pool is what skiff picks on such a container
(60% of the container's memory; given as --memory-limit, since skiff reads cgroup v2's
memory.max and /proc/meminfo, not v1 files). Measured per type: start to ready; each query
kind's first run (fresh caches) and the median of --reps warm runs (result cache off, so each
run executes); errors (an OOM kill, 507, 504); the cgroup's peak memory. A type that cannot
hold more vCPUs than the machine has is measured with the machine's cores and says so.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("SKIFF_SHARED_DIR", os.path.join(os.path.dirname(ROOT), "shared"))
TOKEN = "sizing-token"
GIB = 1 << 30

# Cloudflare's documented instance types: vCPU, memory.
TYPES = {
    "lite": (1 / 16, GIB // 4),
    "basic": (1 / 4, GIB),
    "standard-1": (1 / 2, 4 * GIB),
    "standard-2": (1, 6 * GIB),
    "standard-3": (2, 8 * GIB),
    "standard-4": (4, 12 * GIB),
}


def queries():
    out = []
    for d in (os.path.join(SHARED, "bench/queries"), os.path.join(ROOT, "tests/queries")):
        for f in sorted(os.listdir(d)):
            if f.endswith(".sql"):
                text = open(os.path.join(d, f)).read()
                sql = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("--"))
                out.append((f[:-4], sql))
    return out


class Cgroup:
    """A cgroup with a CPU quota and a memory limit, v2 or v1."""

    def __init__(self, name, vcpu, memory):
        self.v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers") and {"cpu", "memory"} <= set(
            open("/sys/fs/cgroup/cgroup.controllers").read().split())
        period = 100_000
        quota = int(vcpu * period)
        if self.v2:
            self.dirs = [f"/sys/fs/cgroup/{name}"]
            os.makedirs(self.dirs[0], exist_ok=True)
            self.write(self.dirs[0], "cpu.max", f"{quota} {period}")
            self.write(self.dirs[0], "memory.max", str(memory))
            self.write(self.dirs[0], "memory.swap.max", "0")
        else:
            self.dirs = [f"/sys/fs/cgroup/cpu/{name}", f"/sys/fs/cgroup/memory/{name}"]
            for d in self.dirs:
                os.makedirs(d, exist_ok=True)
            self.write(self.dirs[0], "cpu.cfs_period_us", str(period))
            self.write(self.dirs[0], "cpu.cfs_quota_us", str(quota))
            self.write(self.dirs[1], "memory.limit_in_bytes", str(memory))
            try:
                self.write(self.dirs[1], "memory.memsw.limit_in_bytes", str(memory))
            except OSError:
                pass  # no swap accounting: the machine has no swap either
            self.write(self.dirs[1], "memory.max_usage_in_bytes", "0")
        self.kind = "cgroup v2 (cpu.max, memory.max)" if self.v2 else "cgroup v1 (cpu.cfs_quota_us, memory.limit_in_bytes)"

    @staticmethod
    def write(d, f, v):
        with open(os.path.join(d, f), "w") as fh:
            fh.write(v)

    def procs_files(self):
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def peak(self):
        if self.v2:
            p = os.path.join(self.dirs[0], "memory.peak")
            return int(open(p).read()) if os.path.exists(p) else None
        return int(open(os.path.join(self.dirs[1], "memory.max_usage_in_bytes")).read())

    def oom_kills(self):
        f = os.path.join(self.dirs[0], "memory.events") if self.v2 else os.path.join(self.dirs[1], "memory.oom_control")
        for line in open(f):
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def remove(self):
        for d in self.dirs:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(base, sql, timeout):
    req = urllib.request.Request(base + "/query", data=json.dumps({"query": sql}).encode(),
                                 headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return time.perf_counter() - t, 200
    except urllib.error.HTTPError as e:
        return time.perf_counter() - t, e.code
    except Exception:
        return time.perf_counter() - t, 0


def measure(args, name, vcpu, memory):
    cpus = os.cpu_count()
    cg = Cgroup(f"skiff-sizing-{name}", min(vcpu, cpus), memory)
    pool = int(memory * 0.6)
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix=f"skiff-sizing-{name}-", suffix=".log", delete=False)
    # The shell joins the cgroup, then becomes skiff: everything skiff does is inside the limits.
    join = "; ".join(f"echo $$ > {p}" for p in cg.procs_files())
    cmd = [
        "sh", "-c", f"{join}; exec \"$0\" \"$@\"", args.skiff, "serve",
        "--catalog-uri", f"sqlite://{args.lake}/catalog.db", "--warehouse", f"{args.lake}/warehouse",
        "--http-addr", f"127.0.0.1:{port}", "--flight-addr", "off", "--memory-limit", str(pool),
        "--result-cache-bytes", "0", "--query-timeout", f"{args.timeout}s", "--catalog-wait", "0s",
    ]
    env = dict(os.environ, API_TOKEN=TOKEN, RUST_LOG="warn")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    ready = None
    while time.perf_counter() - start < 300 and proc.poll() is None:
        try:
            with urllib.request.urlopen(base + "/_health", timeout=2) as r:
                if r.status == 200:
                    ready = time.perf_counter() - start
                    break
        except Exception:
            pass
        time.sleep(0.05)
    result = {"type": name, "vcpu": vcpu, "vcpu_measured": min(vcpu, cpus), "memory": memory,
              "memory_pool": pool, "limits": cg.kind, "ready_s": ready, "queries": {}}
    if ready is not None:
        for qname, sql in queries():
            first, status = post(base, sql, args.timeout + 10)
            runs, statuses = [], [status]
            if status == 200:
                for _ in range(args.reps):
                    t, st = post(base, sql, args.timeout + 10)
                    statuses.append(st)
                    if st == 200:
                        runs.append(t)
            result["queries"][qname] = {
                "first_s": round(first, 3), "warm_median_s": round(statistics.median(runs), 3) if runs else None,
                "statuses": sorted(set(statuses)),
            }
            if proc.poll() is not None:
                break
    result["exited"] = proc.poll()
    result["oom_kills"] = cg.oom_kills()
    result["peak_memory"] = cg.peak()
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    result["log_tail"] = open(log.name).read()[-2000:]
    os.unlink(log.name)
    cg.remove()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skiff", required=True)
    ap.add_argument("--lake", required=True, help="a lake from shared/bench/gen_lake.py (catalog.db, warehouse/)")
    ap.add_argument("--types", default="basic,standard-1,standard-2,standard-3")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=60, help="skiff's --query-timeout, seconds")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.lake = os.path.abspath(args.lake)
    out = {"lake": args.lake, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "cpu": subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip(),
           "cores": os.cpu_count(), "results": []}
    for t in args.types.split(","):
        vcpu, memory = TYPES[t]
        print(f"== {t}: {vcpu} vCPU, {memory / GIB:g} GiB", file=sys.stderr)
        r = measure(args, t, vcpu, memory)
        out["results"].append(r)
        ok = [q for q in r["queries"].values() if q["statuses"] == [200]]
        print(f"   ready {r['ready_s']}, {len(ok)}/{len(r['queries'])} kinds ok, peak {r['peak_memory']}, "
              f"oom kills {r['oom_kills']}, exited {r['exited']}", file=sys.stderr)
        for q, v in r["queries"].items():
            print(f"   {q:22} first {v['first_s']:>7}  warm {v['warm_median_s']}  {v['statuses']}", file=sys.stderr)
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
