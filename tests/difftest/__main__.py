"""scripts/difftest: generated queries against skiff with every rule and without any (oracle b),
and against DuckDB over the same Iceberg tables (oracle a). See tests/difftest/README.md.

    scripts/difftest --seed S --queries N --lake DIR [--server URL --server-off URL --token T]
                     [--out report.json] [--save-regressions]

The last stdout line is the report as one JSON object; a readable summary goes to stderr.
Exit status: 0 when nothing differed and no server failed, 1 otherwise, 2 on bad usage.
"""
import argparse
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from . import known, lake as lakemod
from .compare import Spec, compare, spec_of
from .engines import DeadServer, Duck, Skiff, restart, start_skiff
from .gen import Generator
from .reduce import reduce

HERE = os.path.dirname(os.path.abspath(__file__))
REGRESSIONS = os.path.join(HERE, "regressions")
# skiff's statuses that are not a verdict on the query: overloaded, timed out, out of memory
RESOURCE = {503, 504, 507, 429}
NO_ANSWER = 599  # engines.py: no answer within --timeout, though skiff's own timeout answers 504


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Outcome:
    """One query's verdict: `kind` is None (agreed or not compared), "mismatch" or "failure"."""

    def __init__(self):
        self.kind = None
        self.oracle = None
        self.why = ""
        self.answers = {}
        self.notes = []

    def signature(self):
        return (self.kind, self.oracle, self.why.split(":")[0])


class Runner:
    def __init__(self, args, tables):
        self.args = args
        self.tables = tables
        self.counts = Counter()
        self.skipped = Counter()
        self.errors = Counter()
        self.failures = []
        self.mismatches = []
        self.on = self.off = self.duck = None
        self.seconds = Counter()
        self.dead = ("", "")
        self.reduce_spent = 0.0
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(2)

    # ------------------------------------------------------------ engines

    def ask(self, which, sql):
        server = getattr(self, which)
        try:
            a = server.query(sql)
            with self.lock:
                self.seconds[which] += a.elapsed
            return a
        except DeadServer as e:
            tail = server.log_tail()
            with self.lock:
                self.dead = (f"{server.name} died or stopped answering: {e}", tail)
            log(f"!! {server.name} is not answering ({e}); log tail:\n{tail}")
            if server.proc is not None:
                setattr(self, which, restart(server))
                log(f"   restarted {server.name}")
            return None

    def ask_both(self, sql):
        """Both servers at once: each query is small, and two cores are there."""
        f_on = self.pool.submit(self.ask, "on", sql)
        f_off = self.pool.submit(self.ask, "off", sql)
        return f_on.result(), f_off.result()

    def check(self, q, rendered=None, count=True):
        """Runs q on the engines and judges the answers."""
        o = Outcome()
        sql = rendered["df"] if rendered else q.render("df")
        if count:
            self.counts["ran"] += 1
        a_on, a_off = self.ask_both(sql)
        if a_on is None or a_off is None:
            o.kind, o.oracle, o.why = "failure", "b", self.dead[0]
            o.notes.append(self.dead[1])
            return o
        o.answers = {"rules_on": a_on, "rules_off": a_off}
        for name, a in (("rules_on", a_on), ("rules_off", a_off)):
            if not a.ok:
                if count:
                    self.errors[f"skiff:{a.status}:{a.code}"] += 1
                if a.status >= 500 and a.status not in RESOURCE:
                    o.kind, o.oracle = "failure", "b"
                    o.why = (f"{name}: no answer in {self.args.timeout:.0f} s" if a.status == NO_ANSWER
                             else f"{name}: HTTP {a.status} {a.code}: {(a.message or '')[:300]}")
                    server = self.on if name == "rules_on" else self.off
                    o.notes.append(server.log_tail())
                    return o
                if a.ok is False and a.status == 200:
                    o.kind, o.oracle, o.why = "failure", "b", f"{name}: a response cut short ({a.code})"
                    return o
        spec = spec_of(q)
        # oracle b: skiff against itself without its rules
        resource = (not a_on.ok and a_on.status in RESOURCE) or (not a_off.ok and a_off.status in RESOURCE)
        if resource:
            if count:
                self.skipped["b:resource_limit"] += 1
        elif a_on.ok and a_off.ok:
            if count:
                self.counts["compared_b"] += 1
            same, why = compare(a_on.rows, a_off.rows, spec)
            if not same:
                o.kind, o.oracle, o.why = "mismatch", "b", f"answers differ: {why}"
        elif a_on.ok != a_off.ok:
            if count:
                self.counts["compared_b"] += 1
            o.kind, o.oracle = "mismatch", "b"
            o.why = "error on one side: " + ("with rules: " + a_on.brief(200) if not a_on.ok
                                              else "without rules: " + a_off.brief(200))
        else:
            if count:
                self.counts["compared_b"] += 1
            if (a_on.status, a_on.code) != (a_off.status, a_off.code):
                o.kind, o.oracle = "mismatch", "b"
                o.why = f"different errors: {a_on.brief(150)} vs {a_off.brief(150)}"
        if o.kind:
            return o
        # oracle a: DuckDB
        if self.duck is None:
            return o
        reason = known.skip_reason(q, self.facts)
        if reason:
            if count:
                self.skipped[f"a:{reason}"] += 1
            return o
        if not a_on.ok and a_on.status in RESOURCE:
            if count:
                self.skipped["a:resource_limit"] += 1
            return o
        dsql = rendered["duck"] if rendered else q.render("duck")
        d = self.duck.query(dsql)
        self.seconds["duckdb"] += d.elapsed
        o.answers["duckdb"] = d
        if not d.ok and count:
            self.errors[f"duckdb:{d.code}"] += 1
        if count:
            self.counts["compared_a"] += 1
        if a_on.ok and d.ok:
            same, why = compare(a_on.rows, d.rows, Spec(spec.order, spec.limit, spec.tol, tol_all_floats=True))
            reason = None if same else known.answer_reason(q, a_on.rows, d.rows)
            if reason:
                if count:
                    self.counts["compared_a"] -= 1
                    self.skipped[f"a:{reason}"] += 1
            elif not same:
                o.kind, o.oracle, o.why = "mismatch", "a", f"answers differ: {why}"
        elif a_on.ok != d.ok:
            reason = (known.duck_error_reason(d.message) if a_on.ok
                      else known.skiff_error_reason(a_on.status, a_on.message))
            if a_on.ok and d.code == "timeout":
                reason = "duckdb_timeout"
            if reason:
                if count:
                    self.counts["compared_a"] -= 1
                    self.skipped[f"a:{reason}"] += 1
                return o
            o.kind, o.oracle = "mismatch", "a"
            o.why = "error on one side: " + ("skiff: " + a_on.brief(200) if not a_on.ok else "duckdb: " + d.brief(200))
        return o

    # ------------------------------------------------------------ one generated query

    def run_case(self, case):
        q = case.q
        rendered = {"df": q.render("df"), "duck": q.render("duck")}
        if self.args.print_sql:
            log(f"-- {case.n} ({case.shape})\n{rendered['df']};")
        o = self.check(q, rendered)
        if o.kind is None:
            return
        self.record(case, q, rendered, o)

    def record(self, case, q, rendered, o):
        entry = {"n": case.n, "shape": case.shape, "kind": o.kind, "oracle": o.oracle, "why": o.why,
                 "query": rendered["df"], "answers": {k: a.to_json() for k, a in o.answers.items()}}
        if o.oracle == "a":
            entry["duckdb_query"] = rendered["duck"]
        if o.notes:
            entry["log_tail"] = o.notes[0]
        if o.kind == "failure":
            self.failures.append(entry)
        else:
            self.mismatches.append(entry)
        log(f"!! {o.kind} (oracle {o.oracle}) at query {case.n} ({case.shape}): {o.why}\n   {rendered['df'][:600]}")
        left = self.args.reduce_total_seconds - self.reduce_spent
        if self.args.reduce and self.counts["reduced"] < self.args.max_reductions and left > 1:
            self.counts["reduced"] += 1
            sig = o.signature()
            t0 = time.monotonic()
            small, tries = reduce(q, lambda c: self.check(c, count=False).signature() == sig,
                                  budget_s=min(self.args.reduce_seconds, left))
            self.reduce_spent += time.monotonic() - t0
            again = self.check(small, count=False)
            entry["reduced"] = small.render("df")
            entry["reduced_duckdb"] = small.render("duck")
            entry["reduced_spec"] = spec_of(small).to_json()
            entry["reduced_answers"] = {k: a.to_json() for k, a in again.answers.items()}
            entry["reduced_why"] = again.why
            entry["reduce_tries"] = tries
            log(f"   reduced in {tries} tries to:\n   {entry['reduced']}\n   {again.why}")
            for k, a in again.answers.items():
                log(f"   {k}: {a.brief(300)}")
            if self.args.save_regressions:
                entry["saved"] = save_regression(entry, self.args)
                log(f"   saved {entry['saved']}")

    # ------------------------------------------------------------ regressions

    def replay(self, directory):
        files = sorted(f for f in os.listdir(directory) if f.endswith(".sql")) if os.path.isdir(directory) else []
        for f in files:
            path = os.path.join(directory, f)
            reg = read_regression(path)
            self.counts["regressions"] += 1
            o = self.check_text(reg)
            if o.kind:
                self.counts["regressions_failed"] += 1
                entry = {"regression": f, "kind": o.kind, "oracle": o.oracle, "why": o.why, "query": reg["df"],
                         "answers": {k: a.to_json() for k, a in o.answers.items()}}
                if o.notes:
                    entry["log_tail"] = o.notes[0]
                (self.failures if o.kind == "failure" else self.mismatches).append(entry)
                log(f"!! regression {f}: {o.kind} (oracle {o.oracle}): {o.why}")

    def check_text(self, reg):
        """Like check, for a regression file's SQL texts."""

        o = Outcome()
        a_on, a_off = self.ask_both(reg["df"])
        if a_on is None or a_off is None:
            o.kind, o.oracle, o.why = "failure", "b", self.dead[0]
            o.notes.append(self.dead[1])
            return o
        o.answers = {"rules_on": a_on, "rules_off": a_off}
        # every double with the float tolerance: a file does not say which columns are sums
        spec = Spec([tuple(x) for x in reg["spec"].get("order", [])], reg["spec"].get("limit"),
                    reg["spec"].get("tol", []), tol_all_floats=True)
        for name, a in (("rules_on", a_on), ("rules_off", a_off)):
            if not a.ok and a.status >= 500 and a.status not in RESOURCE:
                o.kind, o.oracle, o.why = "failure", "b", f"{name}: HTTP {a.status} {a.code}: {a.message}"
                o.notes.append((self.on if name == "rules_on" else self.off).log_tail())
                return o
        if a_on.ok and a_off.ok:
            same, why = compare(a_on.rows, a_off.rows, spec)
            if not same:
                o.kind, o.oracle, o.why = "mismatch", "b", f"answers differ: {why}"
                return o
        elif a_on.ok != a_off.ok:
            o.kind, o.oracle, o.why = "mismatch", "b", f"error on one side: {a_on.brief(150)} / {a_off.brief(150)}"
            return o
        if self.duck is not None and reg.get("duck") and not (not a_on.ok and a_on.status in RESOURCE):
            d = self.duck.query(reg["duck"])
            o.answers["duckdb"] = d
            if a_on.ok and d.ok:
                same, why = compare(a_on.rows, d.rows, Spec(spec.order, spec.limit, spec.tol, True))
                if not same:
                    o.kind, o.oracle, o.why = "mismatch", "a", f"answers differ: {why}"
            elif a_on.ok != d.ok and not (d.ok and known.skiff_error_reason(a_on.status, a_on.message)):
                o.kind, o.oracle, o.why = "mismatch", "a", f"error on one side: {a_on.brief(150)} / {d.brief(150)}"
        return o


# ---------------------------------------------------------------- regression files

def slug(text):
    words = re.findall(r"[a-z_]+", text.lower())
    stop = {"select", "from", "as", "glass", "and", "where", "by", "group", "t", "c", "cast", "null"}
    picked = []
    for w in words:
        if w not in stop and w not in picked and len(w) > 2:
            picked.append(w)
        if len(picked) == 4:
            break
    return "-".join(picked)[:40] or "query"


def save_regression(entry, args):
    os.makedirs(REGRESSIONS, exist_ok=True)
    existing = [f for f in os.listdir(REGRESSIONS) if f.endswith(".sql")]
    for f in existing:
        if read_regression(os.path.join(REGRESSIONS, f))["df"].strip() == entry["reduced"].strip():
            return f  # already kept
    n = 1 + max([int(f[:3]) for f in existing if f[:3].isdigit()] or [0])
    name = f"{n:03d}-{slug(entry['reduced'])}.sql"
    ans = entry["reduced_answers"]
    found = (f"scripts/difftest --seed {args.seed} (query {entry['n']}, {entry['shape']})" if entry["n"] != "--sql"
             else "reduced by hand from a generated query, checked with scripts/difftest --sql")
    oracle = "skiff with all rules vs --disable-rules all" if entry["oracle"] == "b" else "skiff vs DuckDB"
    lines = [f"-- difftest regression: {entry['reduced_why'] or entry['why']}",
             f"-- found by: {found} on {os.path.basename(os.path.abspath(args.lake))}; oracle {entry['oracle']} ({oracle})"]
    for k in ("rules_on", "rules_off", "duckdb"):
        if k in ans:
            lines.append(f"-- {k}: {json.dumps(ans[k], default=str)[:600]}")
    note = entry.get("note") or getattr(args, "note", None)
    if note:
        lines.insert(1, f"-- {note}")
    lines.append(f"-- spec: {json.dumps(entry['reduced_spec'])}")
    lines = [" ".join(line.split("\n")) for line in lines]  # a header line stays one line
    body = "\n".join(lines) + "\n" + entry["reduced"] + ";\n"
    if entry.get("reduced_duckdb") and entry["reduced_duckdb"] != entry["reduced"]:
        body += "-- duckdb:\n" + entry["reduced_duckdb"] + ";\n"
    with open(os.path.join(REGRESSIONS, name), "w") as f:
        f.write(body)
    return name


def read_regression(path):
    """{"df": skiff's SQL, "duck": DuckDB's SQL, "spec": {...}} of a regression file: SQL after
    the header comments; an optional `-- duckdb:` line starts DuckDB's text (default: the same)."""
    text = open(path).read()
    spec = {}
    m = re.search(r"^-- spec: (.*)$", text, re.M)
    if m:
        spec = json.loads(m.group(1))
    parts = re.split(r"^-- duckdb:\s*$", text, maxsplit=1, flags=re.M)

    def sql(part):
        body = "\n".join(line for line in part.splitlines() if not line.lstrip().startswith("--")).strip()
        return body[:-1].strip() if body.endswith(";") else body

    df = sql(parts[0])
    return {"df": df, "duck": sql(parts[1]) if len(parts) > 1 else df, "spec": spec}


# ---------------------------------------------------------------- main

def lake_rows(tables):
    total = 0
    for t in tables.values():
        if t.name == "glass.events" or t.kind == "identities":
            for loc, has_snapshot, _ in t.physical:
                if not has_snapshot:
                    continue
                path = loc[len("file://"):] if loc.startswith("file://") else loc
                meta = json.load(open(path))
                snap = next((s for s in meta.get("snapshots", []) if s["snapshot-id"] == meta.get("current-snapshot-id")), None)
                total += int((snap or {}).get("summary", {}).get("total-records", 0))
    return total


stop_requested = False


def request_stop(signum, frame):
    """SIGINT/SIGTERM: finish the query under way, stop the servers started here, report."""
    global stop_requested
    if stop_requested:
        raise KeyboardInterrupt
    stop_requested = True


def main():
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    ap = argparse.ArgumentParser(prog="scripts/difftest", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--lake", required=True, help="a lake folder (catalog.db + warehouse/)")
    ap.add_argument("--server", help="skiff with its rules (default: started here)")
    ap.add_argument("--server-off", help="skiff with --disable-rules all (with --server)")
    ap.add_argument("--token", default=os.environ.get("API_TOKEN"))
    ap.add_argument("--out", help="write the JSON report here too")
    ap.add_argument("--save-regressions", action="store_true",
                    help="keep each reduced mismatch as tests/difftest/regressions/NNN-name.sql")
    ap.add_argument("--no-duckdb", action="store_true", help="oracle b only")
    ap.add_argument("--duckdb-materialize", choices=["auto", "yes", "no"], default="auto",
                    help="read the lake into DuckDB tables once (auto: under 3M rows)")
    ap.add_argument("--no-reduce", dest="reduce", action="store_false")
    ap.add_argument("--max-reductions", type=int, default=10)
    ap.add_argument("--reduce-seconds", type=float, default=60, help="per mismatch")
    ap.add_argument("--reduce-total-seconds", type=float, default=300)
    ap.add_argument("--max-seconds", type=float, default=0, help="stop generating after this long (0: no limit)")
    ap.add_argument("--no-regressions", action="store_true", help="do not replay tests/difftest/regressions")
    ap.add_argument("--first", type=int, default=0, help="start at query number FIRST of the seed's sequence")
    ap.add_argument("--print-sql", action="store_true")
    ap.add_argument("--sql", action="append", default=[],
                    help="run this SQL text on every engine and show the answers (no generation; repeatable); "
                         "with --save-regressions a mismatch is kept as a regression")
    ap.add_argument("--duckdb-sql", help="DuckDB's text for --sql, when it must differ")
    ap.add_argument("--note", help="a line for the header of a regression saved from --sql")
    ap.add_argument("--spec", default="{}", help='how --sql answers compare: {"order": [[col, desc]], "limit": n, "tol": [col]}')
    ap.add_argument("--disable-flag", default=os.environ.get("DIFFTEST_DISABLE_ARGS", "--disable-rules all"),
                    help="serve arguments of the server without rules (empty: two normal servers)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for one answer")
    ap.add_argument("--memory-limit", default="3GiB",
                    help="--memory-limit of the servers started here (skiff's default, 60%% of the machine's "
                         "memory each, lets two of them push a shared machine into the OOM killer)")
    args = ap.parse_args()
    if bool(args.server) != bool(args.server_off):
        ap.error("--server and --server-off go together")

    t0 = time.monotonic()
    tables = lakemod.load(args.lake)
    if not any(t.kind == "events" for t in tables.values()):
        ap.error(f"{args.lake} has no events table")
    runner = Runner(args, tables)
    rows = lake_rows(tables)
    duck = None
    if not args.no_duckdb:
        mat = args.duckdb_materialize == "yes" or (args.duckdb_materialize == "auto" and rows < 3_000_000)
        duck = Duck(args.lake, tables, materialize=mat, timeout=args.timeout)
        log(f"duckdb: {'tables read once' if mat else 'views over iceberg_scan'} ({rows:,} rows)")
    values = (duck or Duck(args.lake, tables, materialize=False)).sample_values(tables)
    runner.duck = duck
    runner.facts = duck.facts(tables) if duck else {}
    if runner.facts.get("neg_zero"):
        log("the lake holds -0.0: comparisons of doubles are not checked against DuckDB (known.py: signed_zero)")
    started = []
    shapes = Counter()
    try:
        if args.server:
            runner.on = Skiff(args.server, args.token, "rules_on", timeout=args.timeout)
            runner.off = Skiff(args.server_off, args.token, "rules_off", timeout=args.timeout)
        else:
            mem = ["--memory-limit", args.memory_limit] if args.memory_limit else []
            runner.on = start_skiff(args.lake, "rules_on", extra_args=mem)
            started.append(runner.on)
            runner.off = start_skiff(args.lake, "rules_off", extra_args=mem + args.disable_flag.split())
            started.append(runner.off)
            for s in started:
                s.timeout = args.timeout
        if args.sql:
            for text in args.sql:
                spec = json.loads(args.spec)
                o = runner.check_text({"df": text, "duck": args.duckdb_sql or text, "spec": spec})
                log(f"-- {text}\n   verdict: {o.kind or 'agree'} {o.oracle or ''} {o.why}")
                for k, a in o.answers.items():
                    log(f"   {k}: {a.brief(2000)}")
                if o.kind:
                    entry = {"n": "--sql", "shape": "by hand", "kind": o.kind, "oracle": o.oracle, "why": o.why,
                             "query": text, "answers": {k: a.to_json() for k, a in o.answers.items()}}
                    (runner.failures if o.kind == "failure" else runner.mismatches).append(entry)
                    if args.save_regressions:
                        entry.update(reduced=text, reduced_duckdb=args.duckdb_sql or text, reduced_spec=spec,
                                     reduced_answers=entry["answers"], reduced_why=o.why)
                        log(f"   saved {save_regression(entry, args)}")
            args.queries = 0
        elif not args.no_regressions:
            runner.replay(REGRESSIONS)
        gen = Generator(tables, values, args.seed)
        for n in range(args.first, args.first + args.queries):
            if args.max_seconds and time.monotonic() - t0 > args.max_seconds:
                log(f"stopping after {args.max_seconds:.0f} s")
                break
            if stop_requested:
                log("stopping: interrupted (the report covers the queries run so far)")
                runner.counts["interrupted"] = 1
                break
            try:
                case = gen.case(n)
            except Exception as e:  # a generator bug: counted, and the run goes on
                runner.errors[f"generator:{type(e).__name__}"] += 1
                log(f"!! the generator failed on query {n}: {type(e).__name__}: {e}")
                continue
            runner.counts["generated"] += 1
            shapes[case.shape] += 1
            runner.run_case(case)
            if (n - args.first + 1) % 250 == 0:
                log(f"{n - args.first + 1} queries, {len(runner.mismatches)} mismatches, "
                    f"{len(runner.failures)} failures, {time.monotonic() - t0:.0f} s")
    finally:
        # the servers started here, restarted ones included
        for srv in (runner.on, runner.off):
            if srv is not None and srv.proc is not None:
                srv.stop()
        for s in started:
            s.stop()
        logdirs = {os.path.dirname(s.log) for s in started if s.log}
        if runner.failures:
            log(f"server logs kept in {', '.join(sorted(logdirs))}")
        else:
            for d in logdirs:
                shutil.rmtree(d, ignore_errors=True)
    report = {
        "seed": args.seed, "lake": os.path.abspath(args.lake), "lake_rows": rows,
        "generated": runner.counts["generated"], "ran": runner.counts["ran"],
        "compared": {"b": runner.counts["compared_b"], "a": runner.counts["compared_a"]},
        "skipped": dict(sorted(runner.skipped.items())),
        "mismatches": len(runner.mismatches), "failures": len(runner.failures),
        "errors": dict(sorted(runner.errors.items())),
        "regressions": {"replayed": runner.counts["regressions"], "failed": runner.counts["regressions_failed"]},
        "shapes": dict(sorted(shapes.items())),
        "reduced": runner.counts["reduced"],
        "interrupted": bool(runner.counts["interrupted"]),
        "seconds": round(time.monotonic() - t0, 1),
        "engine_seconds": {k: round(v, 1) for k, v in sorted(runner.seconds.items())},
        "known_differences": known.describe(),
        "mismatch_list": runner.mismatches, "failure_list": runner.failures,
    }
    summary(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(finite(report), f, indent=1, default=str, allow_nan=False)
    del report["known_differences"]  # in --out's file; the line stays readable
    print(json.dumps(finite(report), default=str, allow_nan=False))
    sys.exit(1 if runner.mismatches or runner.failures else 0)


def finite(v):
    """The report as strict JSON: DuckDB's NaN and ±inf as the strings "NaN", "inf", "-inf"."""
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return "NaN" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


def summary(r):
    log(f"\ndifftest seed {r['seed']} on {r['lake']} ({r['lake_rows']:,} rows), {r['seconds']} s")
    log(f"  generated {r['generated']}, ran {r['ran']}; compared: skiff vs skiff without rules {r['compared']['b']}, "
        f"skiff vs DuckDB {r['compared']['a']}")
    if r["skipped"]:
        log("  not compared: " + ", ".join(f"{k} {v}" for k, v in r["skipped"].items()))
    if r["errors"]:
        log("  errors (both sides, not mismatches unless listed below): " +
            ", ".join(f"{k} {v}" for k, v in list(r["errors"].items())[:12]))
    log(f"  regressions replayed {r['regressions']['replayed']}, failing {r['regressions']['failed']}")
    log(f"  MISMATCHES {r['mismatches']}, FAILURES {r['failures']}")
    for m in (r["failure_list"] + r["mismatch_list"])[:30]:
        where = m.get("regression") or f"query {m.get('n')}"
        log(f"  - {m['kind']} oracle {m['oracle']} {where}: {m['why'][:200]}")
        log(f"      {(m.get('reduced') or m['query'])[:400]}")


if __name__ == "__main__":
    main()
