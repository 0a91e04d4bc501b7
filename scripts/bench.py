#!/usr/bin/env python3
"""skiff against DuckDB on the same lakes (driven by scripts/bench, which builds skiff first).

For each lake size: makes the lake with ../shared/bench/gen_lake.py unless it is cached, starts
`skiff serve` on it, and measures
- start to /_health ready;
- the first query after start (trends) against the same query warm: in the run's first start,
  then in three more fresh starts (one sample is at the mercy of a machine waking from idle);
- ../shared/bench/bench.py, side by side with DuckDB (iceberg extension), over the benchmark's
  query kinds, skiff's own (tests/queries) and the metadata-only aggregates (count(*), min/max
  of a column over the whole versioned table);
- skiff's peak resident memory over the whole run (VmHWM).
With --tpch 1,10 it also runs TPC-H at those scale factors: the lake made once with
../shared/bench/tpch.py (cached as <lake-dir>/tpch-sf<N>), the 22 queries side by side with
DuckDB, answers compared, and skiff's peak resident memory. `--events ''` skips the event lakes.
Prints one markdown table per lake and a summary; --json writes everything measured.

With --remote-latency-ms N it measures instead skiff on the same lake in S3: served by s3s-fs
(`cargo install s3s-fs@0.14.1 --features binary --root ~/.cache/s3s-fs`) behind
tests/fixtures/s3_proxy.py adding N ms to every request, against skiff on local disk: each
query's first (cold) time, its warm median, and the answers compared.
"""
import argparse
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("SKIFF_SHARED_DIR", os.path.join(os.path.dirname(ROOT), "shared"))
TOKEN = "bench-token"
# Result-cache hits: every cached kind asked this many times, in turns.
HIT_ROUNDS = 30

METADATA_QUERIES = {
    "meta_count": "SELECT count(*) AS n FROM glass.events",
    "meta_min_max": "SELECT min(timestamp) AS first, max(timestamp) AS last FROM glass.events",
    "meta_min_max_ingest": "SELECT min(__ingest_ts) AS first, max(__ingest_ts) AS last FROM glass.events",
}


def events(label):
    m = re.fullmatch(r"(\d+)([km]?)", label.lower())
    if not m:
        sys.exit(f"--events: expected sizes like 3m,10m,30m (got {label!r})")
    return int(m.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2)]


def ensure_lake(base, label):
    """The cached event lake for `label`, made on first use."""
    return cached_lake(os.path.join(base, f"lake-{label}"),
                       f"{events(label):,} events; about 7 minutes per 30M",
                       [os.path.join(SHARED, "bench/gen_lake.py"), "--events", str(events(label))])


def cached_lake(path, what, make):
    """`path`, made by running `make --out path` unless it is already there. `.complete` marks a
    finished lake: its metadata holds absolute paths, so it is written in place, never moved."""
    if os.path.exists(os.path.join(path, ".complete")):
        return path
    if os.path.exists(os.path.join(path, "catalog.db")):
        sys.exit(f"{path} exists without .complete: it is being written or was cut short; "
                 "wait for it, or delete it to have it made again (touch .complete to use it as is)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print(f"== making {path} ({what})", file=sys.stderr)
    subprocess.run([sys.executable, *make, "--out", path], check=True, stdout=sys.stderr)
    open(os.path.join(path, ".complete"), "w").close()
    return path


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(base, sql, timeout=300, headers=None):
    req = urllib.request.Request(base + "/query", data=json.dumps({"query": sql}).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = json.loads(r.read())
        if headers is not None:
            headers.update({k.lower(): v for k, v in r.headers.items()})
        return body


def timed(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def vm_hwm_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


class Skiff:
    def __init__(self, binary, lake, extra, log, storage=None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, API_TOKEN=TOKEN, RUST_LOG=os.environ.get("RUST_LOG", "warn"),
               # Measure the engine, not the result cache (a flag after -- overrides this).
               SKIFF_RESULT_CACHE_BYTES=os.environ.get("SKIFF_RESULT_CACHE_BYTES", "0"))
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            [binary, "serve", "--http-addr", f"127.0.0.1:{self.port}",
             "--catalog-uri", f"sqlite://{lake}/catalog.db",
             *(storage or ["--warehouse", f"{lake}/warehouse"]), *extra],
            env=env, stdout=subprocess.DEVNULL, stderr=log)
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"skiff exited with {self.proc.returncode} before it was ready (log: {log.name})")
            try:
                with urllib.request.urlopen(self.base + "/_health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.005)
        self.startup_ms = (time.perf_counter() - t) * 1000

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def run_bench(lake, queries, server, reps, threads):
    """../shared/bench/bench.py over one folder; its per-query lines and summary, parsed."""
    out = subprocess.run(
        [sys.executable, os.path.join(SHARED, "bench/bench.py"), "--lake", lake, "--queries", queries,
         "--server", server, "--token", TOKEN, "--reps", str(reps), "--threads", str(threads)],
        check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines()[1:-1]:
        parts = line.split(None, 4)
        if len(parts) < 4:
            continue
        name, d_ms, s_ms, ratio = parts[:4]
        answers = parts[4] if len(parts) > 4 else ""
        num = lambda v: None if v in ("None", "-") else float(v)
        rows.append({"query": name, "duckdb_ms": num(d_ms), "skiff_ms": num(s_ms), "ratio": num(ratio),
                     "same": answers == "same", "why": "" if answers == "same" else answers})
    return rows


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def one_lake(args, label):
    lake = ensure_lake(args.lake_dir, label)
    log = tempfile.NamedTemporaryFile("w", prefix=f"skiff-bench-{label}-", suffix=".log", delete=False)
    skiff = Skiff(args.skiff, lake, args.skiff_args, log)
    try:
        trends = open(os.path.join(SHARED, "bench/queries/trends.sql")).read()
        first_ms = timed(lambda: post(skiff.base, trends))
        rows = []
        with tempfile.TemporaryDirectory() as meta:
            for name, sql in METADATA_QUERIES.items():
                with open(os.path.join(meta, f"{name}.sql"), "w") as f:
                    f.write(sql + "\n")
            folders = [os.path.join(SHARED, "bench/queries"), os.path.join(ROOT, "tests/queries"), meta]
            for folder in folders:
                rows += run_bench(lake, folder, skiff.base, args.reps, args.threads)
            kinds_sql = {os.path.splitext(f)[0]: open(os.path.join(d, f)).read()
                         for d in folders[:2] for f in sorted(os.listdir(d)) if f.endswith(".sql")}
        warm_ms = statistics.median(timed(lambda: post(skiff.base, trends)) for _ in range(3))
        peak = vm_hwm_mib(skiff.proc.pid)
    finally:
        skiff.stop()
    restarts = [first_after_start(args, lake, log, trends) for _ in range(3)]
    # The result cache, on a server of its own: every kind asked once, then answered from it,
    # the kinds taking turns so that one slow moment of the machine is not one kind's median.
    cached = Skiff(args.skiff, lake, args.skiff_args + ["--result-cache-bytes", "64MiB"], log)
    hits = {}
    try:
        for name, sql in kinds_sql.items():
            post(cached.base, sql)
            state = {}
            post(cached.base, sql, headers=state)
            # Queries with volatile functions (now(), random()) bypass the cache.
            if state.get("x-skiff-result-cache") == "hit":
                hits[name] = []
        for _ in range(HIT_ROUNDS):
            for name, times in hits.items():
                state = {}
                times.append(timed(lambda: post(cached.base, kinds_sql[name], headers=state)))
                if state.get("x-skiff-result-cache") != "hit":
                    sys.exit(f"{name}: a timed repeat was not a result-cache hit")
    finally:
        cached.stop()
    cache_hit_ms = {name: statistics.median(times) for name, times in hits.items()}
    kinds = [r for r in rows if not r["query"].startswith("meta_")]
    benchmark = {f[:-4] for f in os.listdir(os.path.join(SHARED, "bench/queries")) if f.endswith(".sql")}
    result = {
        "lake": label, "events": events(label), "rows": rows,
        "geomean_ratio": geomean([r["ratio"] for r in kinds]),
        "geomean_benchmark_kinds": geomean([r["ratio"] for r in kinds if r["query"] in benchmark]),
        "geomean_without_metadata": geomean([r["ratio"] for r in kinds if not r["query"].startswith("meta")]),
        "worst": max(kinds, key=lambda r: r["ratio"] or math.inf),
        "slowest_skiff_ms": max((r["skiff_ms"] or math.inf) for r in kinds),
        "matched": sum(r["same"] for r in rows), "queries": len(rows),
        "startup_ms": skiff.startup_ms, "first_ms": first_ms, "warm_ms": warm_ms, "restarts": restarts,
        "peak_rss_mib": peak, "cache_hit_ms": cache_hit_ms, "log": log.name,
    }
    print_table(result)
    return result


def first_after_start(args, lake, log, sql):
    """A fresh server: start to ready, the query's first run and its warm median, in ms."""
    skiff = Skiff(args.skiff, lake, args.skiff_args, log)
    try:
        first_ms = timed(lambda: post(skiff.base, sql))
        warm_ms = statistics.median(timed(lambda: post(skiff.base, sql)) for _ in range(3))
    finally:
        skiff.stop()
    return {"startup_ms": skiff.startup_ms, "first_ms": first_ms, "warm_ms": warm_ms}


def query_files(meta_dir):
    """Every query the suite runs, as (name, sql): the benchmark's, skiff's own and the
    metadata-only aggregates (written to `meta_dir`)."""
    for name, sql in METADATA_QUERIES.items():
        with open(os.path.join(meta_dir, f"{name}.sql"), "w") as f:
            f.write(sql + "\n")
    folders = [os.path.join(SHARED, "bench/queries"), os.path.join(ROOT, "tests/queries"), meta_dir]
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if name.endswith(".sql"):
                with open(os.path.join(folder, name)) as f:
                    yield name[:-4], f.read()


def canonical(rows):
    """Rows in a comparable form: floats to 9 significant digits (partial sums add up in
    another order when the files are split otherwise), in sorted order."""
    def norm(v):
        return float(f"{v:.9g}") if isinstance(v, float) else v
    return sorted(json.dumps({k: norm(v) for k, v in r.items()}, sort_keys=True) for r in rows)


def remote_lake(args, label):
    """skiff on the lake in S3 with added latency, against skiff on the same lake on disk."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import s3_lake
    if not os.path.exists(args.s3s_fs):
        sys.exit(f"{args.s3s_fs} missing: cargo install s3s-fs@0.14.1 --features binary --root ~/.cache/s3s-fs")
    lake = ensure_lake(args.lake_dir, label)
    out = s3_lake.copy(lake)
    log = tempfile.NamedTemporaryFile("w", prefix=f"skiff-bench-remote-{label}-", suffix=".log", delete=False)
    s3 = s3_lake.S3Server(out, args.s3s_fs, log)
    proxy = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests/fixtures/s3_proxy.py"), "--upstream",
                              s3.endpoint, "--delay-ms", str(args.remote_latency_ms), "--quiet"],
                             stdout=subprocess.PIPE, stderr=log, text=True)
    proxy_url = f"http://127.0.0.1:{proxy.stdout.readline().split()[1]}"
    storage = ["--warehouse", "s3://lake/warehouse", "--s3-endpoint", proxy_url, "--s3-region", "us-east-1",
               "--s3-access-key-id", "testing", "--s3-secret-access-key", "testing", "--s3-path-style"]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as meta:
            queries = list(query_files(meta))
        local = Skiff(args.skiff, lake, args.skiff_args, log)
        try:
            for name, sql in queries:
                answer = post(local.base, sql)
                ms = statistics.median(timed(lambda: post(local.base, sql)) for _ in range(args.reps))
                rows.append({"query": name, "local_ms": ms, "answer": canonical(answer)})
        finally:
            local.stop()
        remote = Skiff(args.skiff, out, args.skiff_args, log, storage=storage)
        try:
            for row, (name, sql) in zip(rows, queries):
                t = time.perf_counter()
                answer = post(remote.base, sql)
                row["cold_ms"] = (time.perf_counter() - t) * 1000
                row["warm_ms"] = statistics.median(timed(lambda: post(remote.base, sql)) for _ in range(args.reps))
                row["same"] = canonical(answer) == row.pop("answer")
            peak = vm_hwm_mib(remote.proc.pid)
            with urllib.request.urlopen(proxy_url + "/__control") as r:
                requests = json.loads(r.read())["requests"]
        finally:
            remote.stop()
    finally:
        proxy.terminate()
        s3.stop()
    total = lambda key: sum(r[key] for r in rows)
    result = {"lake": label, "events": events(label), "latency_ms": args.remote_latency_ms, "rows": rows,
              "local_total_ms": total("local_ms"), "warm_total_ms": total("warm_ms"),
              "cold_total_ms": total("cold_ms"), "matched": sum(r["same"] for r in rows),
              "peak_rss_mib": peak, "requests": requests, "log": log.name}
    print(f"\n### {label} in S3, {args.remote_latency_ms:g} ms per request, against local disk\n")
    print("| query | local ms | S3 first ms | S3 warm ms | warm/local | answers |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['query']} | {r['local_ms']:.1f} | {r['cold_ms']:.1f} | {r['warm_ms']:.1f} "
              f"| {r['warm_ms'] / r['local_ms']:.2f} | {'same' if r['same'] else 'DIFFER'} |")
    print()
    print(f"- suite (sum of medians): local {result['local_total_ms']:.0f} ms, S3 warm {result['warm_total_ms']:.0f} ms "
          f"(**{result['warm_total_ms'] / result['local_total_ms']:.2f}×**); each query's first run in S3: "
          f"{result['cold_total_ms']:.0f} ms ({result['cold_total_ms'] / result['local_total_ms']:.2f}×)")
    print(f"- answers equal: {result['matched']}/{len(rows)}; S3 requests {requests}; "
          f"skiff peak RSS (VmHWM) {peak:.0f} MiB")
    sys.stdout.flush()
    return result


def tpch_lake(args, sf):
    """TPC-H at scale factor `sf`: ../shared/bench/tpch.py's 22 queries against skiff and DuckDB
    over the same Iceberg tables, each answer compared, medians of --tpch-reps."""
    lake = cached_lake(os.path.join(args.lake_dir, f"tpch-sf{sf}"),
                       f"TPC-H scale factor {sf}; under a minute at 1, about 15 minutes at 10",
                       [os.path.join(SHARED, "bench/tpch.py"), "make", "--sf", sf])
    log = tempfile.NamedTemporaryFile("w", prefix=f"skiff-bench-tpch{sf}-", suffix=".log", delete=False)
    skiff = Skiff(args.skiff, lake, args.skiff_args, log)
    try:
        out = subprocess.run(
            [sys.executable, os.path.join(SHARED, "bench/tpch.py"), "run", "--lake", lake, "--url", skiff.base,
             "--token", TOKEN, "--reps", str(args.tpch_reps), "--timeout", "600"],
            check=True, capture_output=True, text=True).stdout
        peak = vm_hwm_mib(skiff.proc.pid)
    finally:
        skiff.stop()
    # tpch.py prints `q01 equal duckdb 12.3 ms skiff 45.6 ms <why>` per timed query, then one
    # line per query that was not equal, then a JSON summary.
    line = re.compile(r"(q\d+)\s+(\S+)\s+duckdb\s+([\d.]+) ms\s+skiff\s+([\d.]+) ms\s*(.*)")
    rows = []
    for m in filter(None, map(line.fullmatch, out.splitlines())):
        name, status, d_ms, s_ms, why = m.groups()
        rows.append({"query": name, "duckdb_ms": float(d_ms), "skiff_ms": float(s_ms),
                     "ratio": float(s_ms) / float(d_ms), "same": status == "equal", "why": why})
    summary = json.loads(out.strip().splitlines()[-1])
    failed = [ln.strip() for ln in out.splitlines() if ln.startswith("  q")]
    result = {"lake": f"tpch-sf{sf}", "scale_factor": sf, "rows": rows, "summary": summary, "failed": failed,
              "geomean_ratio": geomean([r["ratio"] for r in rows]), "peak_rss_mib": peak, "log": log.name}
    print(f"\n### TPC-H scale factor {sf}, medians of {args.tpch_reps}\n")
    print_rows(rows)
    over = [r["query"] for r in rows if r["ratio"] > 1.5]
    print()
    print(f"- geometric mean skiff/DuckDB: **{result['geomean_ratio']:.2f}**; skiff {summary['skiff_total_s']:.2f} s "
          f"in all, DuckDB {summary['duckdb_total_s']:.2f} s; over 1.5×: {', '.join(over) or 'none'}")
    print(f"- answers equal: {summary['equal']}/{summary['queries']}"
          + "".join(f"; {f}" for f in failed))
    print(f"- skiff peak RSS (VmHWM): {peak:.0f} MiB")
    sys.stdout.flush()
    return result


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def print_rows(rows):
    """Each query's times side by side, as a markdown table."""
    print("| query | DuckDB ms | skiff ms | skiff/DuckDB | answers |")
    print("|---|---:|---:|---:|---|")
    fmt = lambda v, p=1: "—" if v is None else f"{v:.{p}f}"
    for row in rows:
        print(f"| {row['query']} | {fmt(row['duckdb_ms'])} | {fmt(row['skiff_ms'])} | {fmt(row['ratio'], 2)} "
              f"| {'same' if row['same'] else 'DIFFER ' + row['why'][:80]} |")


def print_table(r):
    print(f"\n### {r['lake']} ({r['events']:,} events)\n")
    print_rows(r["rows"])
    w = r["worst"]
    print()
    print(f"- geometric mean skiff/DuckDB (query kinds, not meta_*): **{r['geomean_ratio']:.2f}**; "
          f"without metadata_aggregates {r['geomean_without_metadata']:.3f}; the kinds of "
          f"../shared/bench/queries {r['geomean_benchmark_kinds']:.3f}; worst {w['query']} {w['ratio']}; "
          f"slowest skiff kind {r['slowest_skiff_ms']:.0f} ms")
    print(f"- answers equal: {r['matched']}/{r['queries']}")
    print(f"- start to /_health: {r['startup_ms']:.0f} ms; first query (trends) {r['first_ms']:.0f} ms "
          f"vs warm {r['warm_ms']:.0f} ms ({r['first_ms'] / r['warm_ms']:.2f}×)")
    starts = ", ".join(f"{s['startup_ms']:.0f}" for s in r["restarts"])
    ratios = [s["first_ms"] / s["warm_ms"] for s in r["restarts"]]
    print(f"- three more fresh starts: start {starts} ms; first query "
          f"{', '.join(f'{x:.2f}×' for x in ratios)} warm (median {statistics.median(ratios):.2f}×)")
    print(f"- skiff peak RSS (VmHWM): {r['peak_rss_mib']:.0f} MiB")
    hits = r["cache_hit_ms"]
    slowest = max(hits, key=hits.get)
    print(f"- result-cache hits ({len(hits)} kinds cached, median of {HIT_ROUNDS} rounds, at the HTTP client): "
          f"{min(hits.values()):.1f}–{hits[slowest]:.1f} ms, slowest {slowest}; "
          f"trends {hits.get('trends', math.nan):.1f} ms")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skiff", required=True, help="the skiff binary")
    ap.add_argument("--events", default="30m", help="lake sizes, comma-separated (3m,10m,30m)")
    ap.add_argument("--lake-dir", default=os.environ.get(
        "SKIFF_BENCH_DIR", os.path.expanduser("~/.cache/skiff-bench")))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tpch", default="", help="TPC-H scale factors, comma-separated (1,10)")
    ap.add_argument("--tpch-reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="DuckDB's threads")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-build", action="store_true", help="(handled by scripts/bench)")
    ap.add_argument("--remote-latency-ms", type=float,
                    help="measure the lake in S3 with this latency per request instead (see above)")
    ap.add_argument("--s3s-fs", default=os.path.expanduser("~/.cache/s3s-fs/bin/s3s-fs"), help="the s3s-fs binary")
    ap.add_argument("skiff_args", nargs="*", help="after --: extra `skiff serve` flags")
    args = ap.parse_args()
    # A loaded machine must not turn slow answers into timeouts.
    if not any(a.startswith("--query-timeout") for a in args.skiff_args):
        args.skiff_args += ["--query-timeout", "600s"]
    print(f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_model()}, {os.cpu_count()} cores; "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
          f"reps {args.reps} (median); skiff {' '.join(args.skiff_args)}")
    run = remote_lake if args.remote_latency_ms is not None else one_lake
    results = [run(args, label.strip()) for label in args.events.split(",") if label.strip()]
    results += [tpch_lake(args, sf.strip()) for sf in args.tpch.split(",") if sf.strip()]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
