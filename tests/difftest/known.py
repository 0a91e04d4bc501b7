"""Where DuckDB and DataFusion (so skiff) legitimately answer differently.

RENDERED: differences the renderer (sqlast.py, engines.py) removes by writing the DuckDB text
so both engines mean the same; nothing is skipped for them.

SKIP: constructs whose answers differ by design. A query that uses one is not compared with
DuckDB (oracle a); the run counts it under the entry's name. Skiff against skiff without its
rules (oracle b) still compares it. Each entry: name, one-line reason, and a test on the
query's objects.
"""
from .sqlast import Agg, Bin, Call, Lit, Win, walk

RENDERED = {
    "null_order": "DataFusion puts NULLs first under DESC and last under ASC, DuckDB last in both: "
                  "DuckDB's text always says NULLS FIRST/LAST",
    "float_literal": "DuckDB reads 1.5 as DECIMAL(2,1), DataFusion as DOUBLE: DuckDB's text casts float literals to DOUBLE",
    "int_division": "DataFusion's `/` on integers truncates, DuckDB's gives a double: DuckDB's text uses `//`",
    "json_functions": "json_get_str/int/float/bool are DuckDB macros over json_type/json_extract that give NULL "
                      "for a value of another type and for invalid JSON, as datafusion-functions-json does",
    "date_bin": "DataFusion's date_bin(interval, ts, origin) is DuckDB's time_bucket(interval, ts, origin)",
    "ignore_nulls": "DataFusion writes lag(x) IGNORE NULLS OVER (…), DuckDB lag(x IGNORE NULLS) OVER (…)",
    "semi_anti_join": "DataFusion's LEFT SEMI/ANTI JOIN is DuckDB's SEMI/ANTI JOIN",
    "char_length": "DataFusion's char_length counts code points; DuckDB's is length (DuckDB's char_length is not a function)",
    "approx_distinct": "approx_distinct is DuckDB's approx_count_distinct",
    "like_escape": "DataFusion's LIKE takes a backslash as escape by default, DuckDB's has no escape: DuckDB's "
                   "text adds ESCAPE '\\' to patterns with a backslash",
    "int_literal": "DuckDB types integer literals as INTEGER (2147483647 * 3 overflows), DataFusion as BIGINT: "
                   "DuckDB's text casts literals beyond 16 bits to BIGINT",
    "empty_version": "a table version without a snapshot is an empty typed SELECT in DuckDB (iceberg_scan cannot read it)",
}


def _int_div_by_column(q):
    return any(isinstance(n, Bin) and n.op in ("/", "%") and n.l.t == "int" and n.r.t == "int"
               and not (isinstance(n.r, Lit) and n.r.v not in (0, None)) for n in walk(q))


def _fn(names):
    return lambda q: any(isinstance(n, (Call, Agg, Win)) and n.fn in names for n in walk(q))


CMP = {"=", "<>", "<", "<=", ">", ">=", "IS DISTINCT FROM", "IS NOT DISTINCT FROM"}


def _float_equality(q, facts):
    """Whether q compares, groups, deduplicates, partitions or ranks by a double that may be -0.0:
    any double when the lake holds -0.0; otherwise one computed in the query (round(-0.3, 0) and
    0.0 * -1.0 are -0.0) or a zero literal."""
    from .sqlast import Between, Col, GroupBy, In, InSub, Select, SetOp

    def maybe(e):
        if e.t != "float":
            return False
        if facts.get("neg_zero"):
            return True
        if isinstance(e, Col):
            return e.name not in facts.get("float_columns", ())
        if isinstance(e, Lit):
            return e.v == 0
        return True

    for n in walk(q):
        if isinstance(n, Bin) and n.op in CMP and (maybe(n.l) or maybe(n.r)):
            return True
        if isinstance(n, (In, Between)) and (maybe(n.e) or any(maybe(x) for x in walk(n) if isinstance(x, Lit))):
            return True
        if isinstance(n, InSub) and maybe(n.e):
            return True
        if isinstance(n, GroupBy) and any(maybe(k) for k in n.keys):
            return True
        if isinstance(n, Select) and n.distinct and any(maybe(i.e) for i in n.items):
            return True
        if isinstance(n, SetOp) and any(maybe(i.e) for i in n.out()):
            return True
        if isinstance(n, Agg) and n.distinct and any(maybe(a) for a in n.args):
            return True
        if isinstance(n, Win) and (any(maybe(p) for p in n.partition) or any(maybe(o.e) for o in n.order)):
            return True
        if isinstance(n, Agg) and any(maybe(o.e) for o in n.order):
            return True
    return False


def _avg_of_unsigned(q):
    """avg over arithmetic on an uncast row_number/rank/dense_rank/ntile, read through a subquery."""
    from .sqlast import Cast, Col, Item, Select
    unsigned = set()
    for n in walk(q):
        if isinstance(n, Select):
            for i in n.items:
                if isinstance(i.e, Win) and i.e.fn in ("row_number", "rank", "dense_rank", "ntile"):
                    unsigned.add(i.alias)
    if not unsigned:
        return False
    for n in walk(q):
        if isinstance(n, Agg) and n.fn in ("avg", "sum", "stddev", "var_samp", "stddev_pop", "median"):
            if any(isinstance(c, Col) and c.name in unsigned for a in n.args for c in walk(a)):
                return True
    return False


def _conflicting_orders(q):
    from .sqlast import Select
    for n in walk(q):
        if isinstance(n, Select):
            orders = {tuple(o.render("df") for o in a.order) for i in n.items for a in walk(i) if isinstance(a, Agg) and a.order}
            if len(orders) > 1:
                return True
    return False


def _nested_empty_grouping_set(q):
    """ROLLUP, CUBE or an empty grouping set below the top: its missing grand-total row over no rows
    (see ANSWERS) changes what the outer query computes, where the answer cannot tell."""
    from .sqlast import GroupBy, Select, SetOp, With
    top = q.body if isinstance(q, With) else q
    for n in walk(q):
        if isinstance(n, (Select, SetOp)) and n is not top and any(
                isinstance(g, GroupBy) and _empty_grouping_set(g) for g in walk(n)):
            return True
    return False


def _variance_overflow(q):
    def huge(e):
        return any(isinstance(x, Lit) and x.t == "float" and x.v is not None and abs(x.v) >= 1e300 for x in walk(e))
    return any(isinstance(n, Agg) and n.fn in ("stddev", "var_samp", "stddev_pop", "var_pop") and any(map(huge, n.args))
               for n in walk(q))


SKIP = [
    ("nested_empty_grouping_set", "ROLLUP/CUBE/() below the top of the query: over no rows DataFusion gives no "
     "grand-total row where DuckDB gives one (empty_grouping_set_of_no_rows), and the outer query sees it",
     lambda q, facts: _nested_empty_grouping_set(q)),
    ("variance_overflow", "stddev/variance of values near 1e308: DataFusion's algorithm overflows to NaN, DuckDB "
     "answers 0 or fails", lambda q, facts: _variance_overflow(q)),
    ("signed_zero", "a double that may be -0.0 (the lake holds it, or the query computes or names it) compared, "
     "grouped or ranked: DataFusion uses IEEE total order (-0.0 < 0.0, apart in GROUP BY and DISTINCT), "
     "DuckDB takes them as equal", lambda q, facts: _float_equality(q, facts)),
    ("conflicting_aggregate_orders", "aggregates with different ORDER BYs in one SELECT: DataFusion refuses them "
     "(not supported), DuckDB answers", lambda q, facts: _conflicting_orders(q)),
    ("avg_decimal", "avg over an expression mixing a ranking function's UInt64 with BIGINT: DataFusion makes it "
     "a DECIMAL and truncates its avg to 4 decimals, DuckDB answers a double",
     lambda q, facts: _avg_of_unsigned(q)),
    ("int_division_by_zero", "an integer `/` or `%` by a column: DataFusion fails on a zero divisor, DuckDB answers NULL",
     lambda q, facts: _int_div_by_column(q)),
    ("approx", "approx_distinct: DataFusion and DuckDB use different HyperLogLog variants",
     lambda q, facts: _fn({"approx_distinct"})(q)),
]


# DuckDB errors where DataFusion answers by design: when DuckDB fails with such a message and
# skiff answered, the query counts as not compared, under the entry's name.
DUCK_ERRORS = [
    ("variance_out_of_range", "stddev/variance over ±inf or values near 1e308: DuckDB fails (out of range), "
     "DataFusion answers inf or NaN", r"(STDDEV_SAMP|STDDEV_POP|VARSAMP|VARPOP) is out of range"),
    ("integer_overflow", "an integer expression beyond 64 bits: DuckDB fails with an overflow error where "
     "DataFusion wraps", r"Overflow in (multiplication|addition|subtraction) of INT64"),
]


# skiff errors (4xx, the same with and without its rules) on valid SQL that DuckDB answers, from
# planning limits of DataFusion that skiff has no fix for yet: when skiff fails with such a message
# and DuckDB answered, the query counts as not compared, under the entry's name. Each entry names
# the upstream issue whose fix removes it.
SKIFF_ERRORS = [
    ("repeated_grouping_sets", "a grouping set listed twice: DataFusion merges the copies into one (a wrong "
     "answer), so skiff refuses it (apache/datafusion#21316, fixed after DataFusion 53)",
     r"skiff cannot answer repeated grouping sets"),
    ("duplicate_aggregate_names", "two aggregates whose names differ only by a cast (sum(x), sum(CAST(x AS "
     "DOUBLE))): DataFusion hides casts in expression names and refuses the duplicate "
     "(apache/datafusion#18975)", r"duplicate unqualified field name"),
    ("scalar_subquery_in_filter", "a scalar subquery inside an aggregate's FILTER (WHERE …): DataFusion's "
     "decorrelation does not reach aggregate filters; apache/datafusion#21240 (scalar subqueries executed as "
     "such, after DataFusion 53) lifts it",
     r"Physical plan does not support logical expression ScalarSubquery"),
]


def skiff_error_reason(status, message):
    import re
    if not 400 <= (status or 0) < 500:
        return None
    for name, _, pattern in SKIFF_ERRORS:
        if re.search(pattern, message or ""):
            return name
    return None


def _empty_grouping_set(q):
    from .sqlast import GroupBy
    return any(isinstance(n, GroupBy) and n.keys and (n.mode in ("rollup", "cube") or
                                                      (n.mode == "sets" and any(not s for s in n.sets)))
               for n in walk(q))


# Answers that differ by design in a recognisable way: (name, reason, test on the query,
# test on (skiff's rows, DuckDB's rows)). The query is then not compared, counted by name.
def _beyond_int64(rows):
    return any(isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63 for r in rows for v in r)


ANSWERS = [
    ("sum_beyond_64_bits", "a BIGINT sum beyond 64 bits: DataFusion wraps around silently, DuckDB widens to HUGEINT",
     lambda q: any(isinstance(n, (Agg, Win)) and n.fn == "sum" for n in walk(q)),
     lambda skiff, duck: _beyond_int64(duck)),
    ("empty_grouping_set_of_no_rows", "ROLLUP/CUBE/GROUPING SETS with the empty set () over no rows: DataFusion "
     "gives no row, DuckDB (and PostgreSQL) a grand-total row (one per copy of the set)",
     _empty_grouping_set, lambda skiff, duck: len(skiff) == 0 and len(duck) >= 1),
]


def answer_reason(q, skiff_rows, duck_rows):
    for name, _, test_q, test_rows in ANSWERS:
        if test_rows(skiff_rows, duck_rows) and test_q(q):
            return name
    return None


def duck_error_reason(message):
    import re
    for name, _, pattern in DUCK_ERRORS:
        if re.search(pattern, message or ""):
            return name
    return None


def skip_reason(q, facts=None):
    """The name of the first SKIP entry q uses, or None. `facts` says what the lake holds."""
    for name, _, test in SKIP:
        if test(q, facts or {}):
            return name
    return None


def describe():
    return {"rendered": RENDERED, "skipped": {name: reason for name, reason, _ in SKIP},
            "duckdb_errors": {name: reason for name, reason, _ in DUCK_ERRORS},
            "skiff_errors": {name: reason for name, reason, _ in SKIFF_ERRORS},
            "answers": {name: reason for name, reason, _, _ in ANSWERS}}
