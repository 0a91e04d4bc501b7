"""The engines a query runs on: skiff over HTTP (two servers: every rule on, every rule off),
and DuckDB with its iceberg extension over the same tables, connected the way
shared/bench/bench.py connects it (glass.events is the UNION ALL BY NAME of every version)."""
import glob
import http.client
import importlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import defaultdict

# DataFusion's JSON functions (datafusion-functions-json) as DuckDB macros: a value of the
# asked type or NULL, never a conversion: json_get_int('{"a": 2.5}', 'a') is NULL, and
# json_get_str of a number is NULL; invalid JSON gives NULL, not an error.
MACROS = [
    """CREATE MACRO _jp(k) AS '$."' || k || '"'""",
    """CREATE MACRO json_get_str(j, k) AS CASE WHEN json_valid(j) THEN
         CASE WHEN json_type(j, _jp(k)) = 'VARCHAR' THEN json_extract_string(j, _jp(k)) END END""",
    """CREATE MACRO json_get_int(j, k) AS CASE WHEN json_valid(j) THEN
         CASE WHEN json_type(j, _jp(k)) IN ('BIGINT', 'UBIGINT') THEN TRY_CAST(json_extract_string(j, _jp(k)) AS BIGINT) END END""",
    """CREATE MACRO json_get_float(j, k) AS CASE WHEN json_valid(j) THEN
         CASE WHEN json_type(j, _jp(k)) IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN TRY_CAST(json_extract_string(j, _jp(k)) AS DOUBLE) END END""",
    """CREATE MACRO json_get_bool(j, k) AS CASE WHEN json_valid(j) THEN
         CASE WHEN json_type(j, _jp(k)) = 'BOOLEAN' THEN TRY_CAST(json_extract_string(j, _jp(k)) AS BOOLEAN) END END""",
]

DUCK_TYPES = {"str": "VARCHAR", "int": "BIGINT", "float": "DOUBLE", "ts": "TIMESTAMP", "bool": "BOOLEAN",
              "date": "DATE"}


class Answer:
    """What an engine said: rows (lists of values in column order), or an error."""

    def __init__(self, rows=None, status=200, code=None, message=None, elapsed=0.0):
        self.rows, self.status, self.code, self.message, self.elapsed = rows, status, code, message, elapsed

    @property
    def ok(self):
        return self.rows is not None

    def brief(self, limit=400):
        if self.ok:
            text = json.dumps(self.rows[:20], default=str)
            more = f" … ({len(self.rows)} rows)" if len(self.rows) > 20 else ""
            return (text[:limit] + ("…" if len(text) > limit else "")) + more
        return f"error {self.status} {self.code}: {(self.message or '')[:limit]}"

    def to_json(self, max_rows=50):
        if self.ok:
            return {"rows": self.rows[:max_rows], "row_count": len(self.rows)}
        return {"status": self.status, "code": self.code, "message": (self.message or "")[:2000]}


class DeadServer(Exception):
    pass


class Skiff:
    """One skiff server, maybe started here."""

    def __init__(self, url, token=None, name="skiff", proc=None, log=None, timeout=120):
        self.url, self.token, self.name, self.proc, self.log, self.timeout = url, token, name, proc, log, timeout
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.conn = None
        self.start_args = None

    def _conn(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self.conn

    def query(self, sql):
        body = json.dumps({"query": sql})
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        t0 = time.monotonic()
        for attempt in range(2):
            try:
                c = self._conn()
                c.request("POST", "/query", body, headers)
                r = c.getresponse()
                data = r.read()
                break
            except (ConnectionError, http.client.HTTPException, socket.timeout, OSError) as e:
                self.conn = None
                if attempt == 1 or not self.alive():
                    if isinstance(e, socket.timeout):
                        return Answer(status=599, code="client_timeout", message=f"no answer in {self.timeout}s",
                                      elapsed=time.monotonic() - t0)
                    raise DeadServer(f"{self.name}: {type(e).__name__}: {e}")
        elapsed = time.monotonic() - t0
        status = r.status
        if status == 200:
            try:
                rows = json.loads(data)
            except ValueError:
                # a response cut short: an error after streaming began
                return Answer(status=200, code="cut_short", message=data[-300:].decode("utf-8", "replace"),
                              elapsed=elapsed)
            if not isinstance(rows, list):
                return Answer(status=200, code="not_rows", message=str(rows)[:300], elapsed=elapsed)
            cols = list(rows[0].keys()) if rows else []
            return Answer([[row.get(c) for c in cols] for row in rows], elapsed=elapsed)
        try:
            err = json.loads(data).get("error", {})
            code, message = err.get("code"), err.get("message")
        except (ValueError, AttributeError):
            code, message = None, data[:500].decode("utf-8", "replace")
        return Answer(status=status, code=code, message=message, elapsed=elapsed)

    def alive(self):
        if self.proc is not None and self.proc.poll() is not None:
            return False
        try:
            c = http.client.HTTPConnection(self.host, self.port, timeout=5)
            c.request("GET", "/_health")
            return c.getresponse().status in (200, 503)
        except OSError:
            return False

    def log_tail(self, lines=40):
        if not self.log or not os.path.exists(self.log):
            return "(no log: the server was not started by difftest)"
        with open(self.log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 20000))
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def skiff_binary():
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.expanduser("~/.cache/skiff-target")
    return os.environ.get("SKIFF_BIN") or os.path.join(target, "release", "skiff")


def start_skiff(lake, name, extra_args=(), extra_env=None, token="difftest-token", logdir=None):
    """`skiff serve` on a loopback port over a lake folder, its log in a file."""
    binary = skiff_binary()
    if not os.path.exists(binary):
        sys.exit(f"no skiff binary at {binary}: build it (cargo build --release) or set SKIFF_BIN")
    logdir = logdir or tempfile.mkdtemp(prefix="difftest-")
    lake = os.path.abspath(lake)
    for _ in range(5):
        port = free_port()
        log = os.path.join(logdir, f"{name}.log")
        env = dict(os.environ)
        env.update({"API_TOKEN": token, "RUST_LOG": env.get("RUST_LOG", "info"),
                    # every query must execute: a cached answer compares nothing
                    "SKIFF_RESULT_CACHE_BYTES": "0"})
        env.pop("SKIFF_API_TOKEN", None)
        env.update(extra_env or {})
        args = [binary, "serve", "--http-addr", f"127.0.0.1:{port}", "--flight-addr", "off",
                "--catalog-uri", f"sqlite://{lake}/catalog.db", "--warehouse", f"{lake}/warehouse", *extra_args]
        with open(log, "ab") as logf:
            proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=logf,
                                    start_new_session=True)
        s = Skiff(f"http://127.0.0.1:{port}", token, name, proc, log)
        s.start_args = (lake, name, extra_args, extra_env, token, logdir)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if s.alive():
                return s
            time.sleep(0.1)
        tail = s.log_tail()
        s.stop()
        if f"127.0.0.1:{port}" in tail and "listen" in tail:
            continue  # the port was taken between picking and binding
        raise RuntimeError(f"skiff ({name}) did not start:\n{tail}")
    raise RuntimeError(f"skiff ({name}): no free port in five tries")


def restart(s):
    lake, name, extra_args, extra_env, token, logdir = s.start_args
    s.stop()
    return start_skiff(lake, name, extra_args, extra_env, token, logdir)


def load_extension(con, name):
    mod = importlib.import_module(f"duckdb_extension_{name}")
    files = glob.glob(os.path.join(os.path.dirname(mod.__file__), "extensions", "*", f"{name}.duckdb_extension"))
    if not files:
        sys.exit(f"no {name}.duckdb_extension in the duckdb-extension-{name} package")
    con.execute(f"LOAD '{files[0]}'")


class Duck:
    """DuckDB over the lake's Iceberg tables. `glass.events` is the UNION ALL BY NAME of every
    version, as bench.py makes it; each `_vN` version is also a view of its own name, as in skiff.
    A version without a snapshot is an empty typed SELECT (iceberg_scan cannot read it).
    With `materialize`, each view's rows are read once into a DuckDB table: the Iceberg reading
    is DuckDB's either way, and queries over a small lake then take milliseconds."""

    def __init__(self, lake, tables, threads=2, materialize=False, timeout=60):
        import duckdb
        self.duckdb = duckdb
        self.timeout = timeout
        self.con = duckdb.connect(config={"allow_unsigned_extensions": "true",
                                          "autoinstall_known_extensions": "false", "threads": threads})
        for ext in ("avro", "iceberg"):
            load_extension(self.con, ext)
        for m in MACROS:
            self.con.execute(m)
        cat = sqlite3.connect(os.path.join(lake, "catalog.db"))
        rows = cat.execute("SELECT table_namespace, table_name, metadata_location FROM iceberg_tables").fetchall()
        groups = defaultdict(list)
        for ns, name, loc in rows:
            groups[(ns, re.sub(r"_v\d+$", "", name))].append((name, loc))
        physical = {}
        for t in tables.values():
            for loc, has_snapshot, cols in t.physical:
                physical[loc] = (has_snapshot, cols)
        schemas = {ns for ns, _ in groups}
        for ns in schemas:
            self.con.execute(f"CREATE SCHEMA IF NOT EXISTS {ns}")
            if materialize:
                self.con.execute(f"CREATE SCHEMA IF NOT EXISTS _raw_{ns}")

        def scan(loc):
            has_snapshot, cols = physical.get(loc, (True, None))
            if has_snapshot or not cols:
                return f"SELECT * FROM iceberg_scan('{loc}')"
            return "SELECT " + ", ".join(f'CAST(NULL AS {DUCK_TYPES[t]}) AS "{n}"' for n, t, _ in cols) + " WHERE false"

        for (ns, base), members in groups.items():
            members.sort()
            views = [(base, [loc for _, loc in members])]
            if len(members) > 1:
                views += [(name, [loc]) for name, loc in members if name != base]
            for name, locs in views:
                union = " UNION ALL BY NAME ".join(scan(loc) for loc in locs)
                if materialize:
                    self.con.execute(f'CREATE TABLE {ns}."{name}" AS {union}')
                else:
                    self.con.execute(f'CREATE VIEW {ns}."{name}" AS {union}')

    def query(self, sql):
        t0 = time.monotonic()
        # a query DuckDB cannot finish in time (a window over 30M rows) is interrupted, not waited for
        timer = threading.Timer(self.timeout, self.con.interrupt)
        timer.start()
        try:
            cur = self.con.execute(sql)
            rows = [list(r) for r in cur.fetchall()]
            return Answer(rows, elapsed=time.monotonic() - t0)
        except self.duckdb.Error as e:
            code = "timeout" if time.monotonic() - t0 >= self.timeout else type(e).__name__
            return Answer(status=0, code=code, message=str(e), elapsed=time.monotonic() - t0)
        finally:
            timer.cancel()

    def facts(self, tables):
        """What the lake holds that decides whether a known difference can show."""
        neg_zero = False
        for t in tables.values():
            for c in t.columns:
                if c.t == "float" and not neg_zero:
                    a = self.query(f'SELECT bool_or("{c.name}" = 0 AND signbit("{c.name}")) FROM {t.name}')
                    neg_zero = bool(a.ok and a.rows and a.rows[0][0])
        floats = {c.name for t in tables.values() for c in t.columns if c.t == "float"}
        return {"neg_zero": neg_zero, "float_columns": floats}

    def sample_values(self, tables, per_column=24):
        """Values to put in predicates: some of each column's values, in a fixed order."""
        values = {}
        for t in tables.values():
            if t.name != "glass.events" and t.kind == "events":
                continue
            for c in t.columns:
                if c.name in values or c.role == "json":
                    continue
                col = f'"{c.name}"'
                if c.t == "str":
                    q = (f"SELECT v FROM (SELECT {col} AS v, count(*) AS n FROM {t.name} WHERE {col} IS NOT NULL "
                         f"GROUP BY 1 ORDER BY n DESC, v LIMIT {per_column})")
                    if c.role == "highcard":
                        q = (f"SELECT v FROM (SELECT DISTINCT {col} AS v FROM {t.name} WHERE {col} IS NOT NULL) "
                             f"ORDER BY hash(v), v LIMIT {per_column // 2}")
                elif c.t in ("int", "float"):
                    q = (f"SELECT quantile_disc({col}, [0, 0.1, 0.25, 0.5, 0.75, 0.9, 1]) FROM {t.name} "
                         f"WHERE isfinite(CAST({col} AS DOUBLE))")
                elif c.t == "ts":
                    q = f"SELECT quantile_disc({col}, [0, 0.05, 0.25, 0.5, 0.75, 0.95, 1]) FROM {t.name}"
                else:
                    continue
                res = self.query(q)
                if not res.ok:
                    continue
                if c.t in ("int", "float", "ts"):
                    vals = [v for v in (res.rows[0][0] or []) if v is not None]
                    if c.t == "ts":
                        vals = [v.strftime("%Y-%m-%d %H:%M:%S.%f") for v in vals]
                else:
                    vals = [r[0] for r in res.rows]
                values[c.name] = vals
        return values
