"""Answers made comparable, and compared.

Values are normalised to tagged tuples so rows sort across types: NULL, booleans, numbers
(ints exact, floats as floats; NaN and ±inf are NULL, as skiff's JSON encodes them),
timestamps and dates (ISO text, microseconds, no zone; skiff's JSON strings and DuckDB's
datetime objects alike), strings, lists.

Row order: where the query's top level has no ORDER BY the rows compare as multisets. With
ORDER BY k LIMIT n, both answers must have the same sequence of k values; rows are compared as
multisets within each run of equal k, except the last run when the LIMIT may have cut it
(ties at the cut may keep different rows in a correct engine; their number must still agree).

Floats: equal when exactly equal (-0.0 equals 0.0), or, in the columns `tol` names, within a
relative tolerance of 1e-9 (a sum's last bits depend on the order its terms are added in).
"""
import datetime as dt
import decimal
import math
import re

TS_TEXT = re.compile(r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(\.\d+)?(Z|\+00:00)?$")
REL_TOL = 1e-9
ABS_TOL = 1e-12


def norm(v):
    if v is None:
        return (0,)
    if isinstance(v, bool):
        return (1, int(v))
    if isinstance(v, (int, float, decimal.Decimal)):
        if isinstance(v, decimal.Decimal):
            v = float(v)
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return (0,)
        return (2, v)
    if isinstance(v, dt.datetime):
        return (3, v.replace(tzinfo=None).strftime("%Y-%m-%dT%H:%M:%S.%f"))
    if isinstance(v, dt.date):
        return (3, v.isoformat())
    if isinstance(v, str):
        m = TS_TEXT.match(v)
        if m:
            frac = (m.group(3) or ".")[1:]
            return (3, f"{m.group(1)}T{m.group(2)}.{(frac + '000000')[:6]}")
        return (4, v)
    if isinstance(v, (list, tuple)):
        return (5, tuple(norm(x) for x in v))
    if isinstance(v, dict):
        return (6, tuple(sorted((k, norm(x)) for k, x in v.items())))
    if isinstance(v, dt.timedelta):
        return (7, v.total_seconds())
    return (8, str(v))


def close(a, b):
    if a == b:
        return True
    if a[0] == 2 and b[0] == 2:
        x, y = float(a[1]), float(b[1])
        return abs(x - y) <= max(REL_TOL * max(abs(x), abs(y)), ABS_TOL)
    if a[0] == 5 and b[0] == 5 and len(a[1]) == len(b[1]):
        return all(close(x, y) for x, y in zip(a[1], b[1]))
    return False


def _is_float(v):
    return v[0] == 2 and isinstance(v[1], float)


class Spec:
    """How two answers of one query compare: `order` is [(column, desc)] of the top-level ORDER
    BY (empty: a multiset), `limit` its LIMIT, `tol` the columns compared with tolerance,
    `tol_all_floats` compares every float with tolerance (DuckDB against skiff)."""

    def __init__(self, order=(), limit=None, tol=(), tol_all_floats=False):
        self.order, self.limit, self.tol, self.tol_all_floats = list(order), limit, set(tol), tol_all_floats

    def tolerant(self, i, v):
        return (self.tol_all_floats or i in self.tol) and _is_float(v)

    def to_json(self):
        return {"order": self.order, "limit": self.limit, "tol": sorted(self.tol)}


def compare(a_rows, b_rows, spec):
    """(True, '') when the answers agree under spec, else (False, what differs)."""
    a = [[norm(v) for v in r] for r in a_rows]
    b = [[norm(v) for v in r] for r in b_rows]
    if len(a) != len(b):
        return False, f"{len(a)} rows vs {len(b)} rows"
    if a and b and len(a[0]) != len(b[0]):
        return False, f"{len(a[0])} columns vs {len(b[0])}"
    if not spec.order:
        return multiset_equal(a, b, spec)
    idx = [i for i, _ in spec.order]
    for n, (ra, rb) in enumerate(zip(a, b)):
        ka, kb = [ra[i] for i in idx], [rb[i] for i in idx]
        if not all(close(x, y) if spec.tolerant(i, x) else x == y for i, x, y in zip(idx, ka, kb)):
            return False, f"row {n}: order key {show(ka)} vs {show(kb)}"
    runs = []
    start = 0
    for n in range(1, len(a) + 1):
        if n == len(a) or [a[n][i] for i in idx] != [a[start][i] for i in idx]:
            runs.append((start, n))
            start = n
    cut = spec.limit is not None and len(a) >= spec.limit
    for k, (lo, hi) in enumerate(runs):
        if cut and k == len(runs) - 1:
            break  # ties at the LIMIT: which of them are kept is open
        ok, why = multiset_equal(a[lo:hi], b[lo:hi], spec)
        if not ok:
            return False, f"rows {lo}..{hi - 1} (equal order keys): {why}"
    return True, ""


def multiset_equal(a, b, spec):
    def key(r):
        return tuple((9,) if spec.tolerant(i, v) else v for i, v in enumerate(r))

    sa = sorted(a, key=lambda r: (key(r), r))
    sb = sorted(b, key=lambda r: (key(r), r))
    for n, (ra, rb) in enumerate(zip(sa, sb)):
        if key(ra) != key(rb):
            return False, f"a row {show(ra)} vs {show(rb)}"
        if not all(close(x, y) for x, y in zip(ra, rb)):
            return False, f"a row {show(ra)} vs {show(rb)} (beyond the float tolerance)"
    return True, ""


def show(row):
    out = []
    for v in row:
        out.append(None if v[0] == 0 else v[1] if len(v) > 1 else v)
    return repr(out)[:300]


def spec_of(q, tol_all_floats=False):
    items = q.out()
    aliases = [i.alias for i in items]
    order = [(aliases.index(k.alias), k.desc) for k in q.order if k.alias in aliases]
    tol = [n for n, i in enumerate(items) if i.e.ix]
    return Spec(order, q.limit, tol, tol_all_floats)
