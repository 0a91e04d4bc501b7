#!/usr/bin/env python3
"""Soak skiff with the attacks of issue 41 mixed with normal traffic, on loopback only, for a
bounded time, and report what held: process deaths, /_health latency, normal queries answered.

    scripts/soak.py [--minutes 30] [--events 200000] [--skiff PATH] [--write docs/robustness.md]

It makes a demo lake (`skiff demo`), starts `skiff serve` with a small memory limit and short
client timeouts, and runs for --minutes:

* a /_health probe every 100 ms (latency recorded);
* two clients sending the Worker's kinds of query one after another (status and latency);
* an attacker cycling through: values over their bounds (array_repeat, repeat, range), plans over
  theirs (CTEs doubling 22 times, a FROM list of 12,000 items, CUBE of 24 columns), 200
  half-sent requests (slowloris), 300 idle connections, two clients that read a large result's
  headers and stop reading, and a sort that must spill past its cap.

Prints one JSON summary; with --write, replaces the results table in that Markdown file
(between the `<!-- soak -->` markers). Exits 1 when the server died or a normal query failed
with a 5xx.
"""
import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

TOKEN = "soak-token"
REPO = Path(__file__).resolve().parent.parent

NORMAL = [
    "SELECT event, count(*) AS n FROM glass.events GROUP BY event ORDER BY n DESC",
    "SELECT date_trunc('day', \"timestamp\") AS d, count(DISTINCT device_id) AS u FROM glass.events GROUP BY 1 ORDER BY 1",
    "SELECT utm_source, count(*) FILTER (WHERE revenue > 10) AS n FROM glass.events_v2 GROUP BY 1 ORDER BY 2 DESC LIMIT 10",
    "SELECT count(*) AS n FROM glass.events e JOIN glass.identities i ON e.device_id = i.device_id",
    "SELECT session_id, count(*) AS n FROM glass.events GROUP BY session_id ORDER BY n DESC LIMIT 20",
]


def refused_queries():
    doubling = "".join(f", c{i} AS (SELECT x FROM c{i - 1} UNION ALL SELECT x FROM c{i - 1})" for i in range(1, 23))
    return [
        "SELECT cardinality(array_repeat(1, 1000000000000))",
        "SELECT length(repeat('x', 2000000000))",
        "SELECT cardinality(range(1000000000))",
        f"WITH c0 AS (SELECT 1 AS x){doubling} SELECT count(*) FROM c22",
        "SELECT 1 FROM " + ", ".join(f"(VALUES (1)) AS v{i}" for i in range(12000)),
        "SELECT count(*) FROM glass.events GROUP BY CUBE (" + ", ".join(f"(event_id || '{i}')" for i in range(24)) + ")",
    ]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.health = []
        self.health_failures = 0
        self.normal = {}
        self.normal_latency = []
        self.attacks = {}

    def add(self, table, key):
        with self.lock:
            table[key] = table.get(key, 0) + 1


def post(base, sql, timeout=60):
    req = urllib.request.Request(f"{base}/query", data=json.dumps({"query": sql}).encode(),
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return 0


def raw_request(port, sql):
    body = json.dumps({"query": sql})
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall((f"POST /query HTTP/1.1\r\nHost: soak\r\nAuthorization: Bearer {TOKEN}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--skiff", default=str(Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache/skiff-target")) / "release/skiff"))
    ap.add_argument("--write", help="a Markdown file whose results table to replace")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="skiff-soak-"))
    subprocess.run([args.skiff, "demo", "--out", str(work / "lake"), "--events", str(args.events)],
                   check=True, stdout=subprocess.DEVNULL)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = ["--memory-limit", "512MiB", "--max-concurrent-queries", "4", "--query-timeout", "20s",
             "--write-timeout", "5s", "--header-timeout", "2s", "--idle-timeout", "10s",
             "--max-connections", "256", "--max-spill-bytes", "64MiB", "--spill-dir", str(work)]
    server = subprocess.Popen(
        [args.skiff, "serve", "--http-addr", f"127.0.0.1:{port}", "--flight-addr", "off",
         "--catalog-uri", f"sqlite://{work}/lake/catalog.db", "--warehouse", str(work / "lake/warehouse"),
         "--api-token", TOKEN, "--result-cache-bytes", "0", *flags],
        stdout=subprocess.DEVNULL, stderr=open(work / "skiff.log", "w"))
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{base}/_health", timeout=1).read()
            break
        except Exception:
            time.sleep(0.1)

    stats = Stats()
    stop = time.monotonic() + args.minutes * 60
    running = lambda: time.monotonic() < stop and server.poll() is None  # noqa: E731

    def health():
        while running():
            t = time.monotonic()
            try:
                urllib.request.urlopen(f"{base}/_health", timeout=5).read()
                with stats.lock:
                    stats.health.append((time.monotonic() - t) * 1000)
            except Exception:
                with stats.lock:
                    stats.health_failures += 1
            time.sleep(0.1)

    def normal(offset):
        i = offset
        while running():
            t = time.monotonic()
            status = post(base, NORMAL[i % len(NORMAL)])
            stats.add(stats.normal, str(status))
            if status == 200:
                with stats.lock:
                    stats.normal_latency.append(time.monotonic() - t)
            i += 1

    def attacker():
        refused = refused_queries()
        round_ = 0
        while running():
            for sql in refused:
                stats.add(stats.attacks, f"over a bound: {post(base, sql)}")
            half = []
            for _ in range(200):
                try:
                    c = socket.create_connection(("127.0.0.1", port))
                    c.sendall(b"POST /query HTTP/1.1\r\nHost: soak\r\n")
                    half.append(c)
                except OSError:
                    stats.add(stats.attacks, "half-sent: connect refused")
            idle = []
            for _ in range(300):
                try:
                    idle.append(socket.create_connection(("127.0.0.1", port)))
                except OSError:
                    stats.add(stats.attacks, "idle: connect refused")
            stalled = [raw_request(port, "SELECT value, repeat('x', 200) AS pad FROM generate_series(1, 50000000)")
                       for _ in range(2)]
            for c in stalled:
                c.recv(64)  # the status line; then nothing more is read
            stats.add(stats.attacks, f"a sort that may spill: {post(base, 'SELECT * FROM glass.events ORDER BY props DESC, url, event_id')}")
            time.sleep(8)  # past every client timeout: the server lets them go
            closed = 0
            for c in half:
                c.settimeout(0.01)
                try:
                    closed += c.recv(1024) == b""
                except (socket.timeout, BlockingIOError):
                    pass
                except OSError:
                    closed += 1
                c.close()
            stats.add(stats.attacks, f"half-sent closed by the server: {closed}/{len(half)}")
            for c in idle + stalled:
                c.close()
            round_ += 1
        stats.add(stats.attacks, f"rounds: {round_}")

    threads = [threading.Thread(target=health), threading.Thread(target=normal, args=(0,)),
               threading.Thread(target=normal, args=(2,)), threading.Thread(target=attacker)]
    started = datetime.now(timezone.utc)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    died = server.poll() is not None
    peak_rss = 0
    if not died:
        for line in open(f"/proc/{server.pid}/status"):
            if line.startswith("VmHWM:"):
                peak_rss = int(line.split()[1]) * 1024
        server.terminate()
        server.wait(30)

    h = sorted(stats.health)
    q = lambda p: round(h[min(len(h) - 1, int(len(h) * p))], 1) if h else None  # noqa: E731
    summary = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                   f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB",
        "minutes": args.minutes,
        "events": args.events,
        "process_deaths": int(died),
        "health": {"probes": len(h), "failures": stats.health_failures, "p50_ms": q(0.5), "p99_ms": q(0.99),
                   "max_ms": round(h[-1], 1) if h else None},
        "normal": {"statuses": stats.normal,
                   "p50_s": round(statistics.median(stats.normal_latency), 3) if stats.normal_latency else None},
        "attacks": stats.attacks,
        "peak_rss_mib": round(peak_rss / 2**20),
        "flags": " ".join(flags[:-2]),
    }
    print(json.dumps(summary, indent=1))
    if args.write:
        write(Path(args.write), summary)
    bad = died or any(k.startswith("5") or k == "0" for k in stats.normal)
    return 1 if bad else 0


def write(path, s):
    rows = [
        ("run", f"{s['date']}, {s['minutes']} min, {s['machine']}, demo lake of {s['events']:,} events"),
        ("server flags", f"`{s['flags']}`"),
        ("process deaths", s["process_deaths"]),
        ("`/_health`", f"{s['health']['probes']:,} probes, {s['health']['failures']} failed; "
                       f"p50 {s['health']['p50_ms']} ms, p99 {s['health']['p99_ms']} ms, max {s['health']['max_ms']} ms"),
        ("normal queries", ", ".join(f"{k}: {v:,}" for k, v in sorted(s["normal"]["statuses"].items()))
         + f"; median {s['normal']['p50_s']} s"),
        ("attacks", "; ".join(f"{k} ×{v:,}" for k, v in sorted(s["attacks"].items()))),
        ("peak resident memory", f"{s['peak_rss_mib']} MiB"),
    ]
    table = "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"
    text = path.read_text()
    start, end = text.index("<!-- soak -->"), text.index("<!-- /soak -->")
    path.write_text(text[:start] + "<!-- soak -->\n" + table + text[end:])


if __name__ == "__main__":
    sys.exit(main())
