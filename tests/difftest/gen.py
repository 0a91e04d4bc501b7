"""The query generator: seeded, over the lake's tables (tests/difftest/lake.py), producing
query objects (tests/difftest/sqlast.py) that have one answer, up to row order where the
query leaves it open: every order a window or a LIMIT depends on ends in columns that
identify a row, and a query's ORDER BY ... LIMIT with ties is compared run by run
(compare.py), so any correct engine gives an equal answer.

`Generator(tables, values, seed).case(i)` is query i of the seed's sequence: the same seed,
lake schema and sampled values give the same queries.
"""
import random
from dataclasses import dataclass, field

from .sqlast import (Agg, Between, Bin, Call, Case, Cast, Col, Cte, Exists, Frame, GroupBy, In, InSub,
                     Interval, Item, Join, Like, Lit, OrderExpr, OrderKey, Select, SetOp, Sub, SubSrc,
                     TableSrc, Un, When, Win, With)
from .lake import JSON_KEYS

# Values worth comparing against besides those sampled from the lake.
EXTRA_STR = ["", "purchase", "$pageview", "google", "US", "Chrome", "pro", "proj_alpha", "a", "%", "zzz"]
LIKE_PATTERNS = ["%", "", "p%", "%e", "%a%", "_", "__", "$%", "%\\_%", "purchase", "%/%", "d\\_1%", "%100\\%%",
                 "h%s://%", "_%_", "proj%", "%ü%"]
DATE_UNITS = ["second", "minute", "hour", "day", "week", "month", "year"]
EXTRACT_FIELDS = ["hour", "day", "dow", "month", "year", "minute", "doy"]
BINS = ["15 minutes", "1 hour", "6 hours", "1 day", "7 days"]
ORIGINS = ["2026-08-01 00:00:00", "2026-08-03 00:00:00", "1970-01-01 00:00:00", "2026-07-27 12:30:00"]


@dataclass
class CRef:
    """A column visible in a scope."""
    e: object         # the expression that reads it (a Col)
    t: str
    role: str
    nullable: bool = True
    ix: bool = False
    name: str = ""    # the lake column it comes from, for sampled values


@dataclass
class Scope:
    cols: list
    unique: list = field(default_factory=list)  # CRefs that together identify a row
    kind: str = "events"
    ts: object = None  # the CRef of the event time, if any

    def of(self, t=None, roles=None, exact=False):
        return [c for c in self.cols if (t is None or c.t == t) and (roles is None or c.role in roles)
                and not (exact and c.ix)]


@dataclass
class GenCase:
    n: int
    shape: str
    q: object


class Generator:
    def __init__(self, tables, values, seed):
        self.tables = tables
        self.values = values      # {column name: [sampled values]}
        self.seed = seed
        self.events = [t for t in tables.values() if t.kind == "events"]
        self.identities = [t for t in tables.values() if t.kind == "identities"]

    # ------------------------------------------------------------ plumbing

    def case(self, n):
        self.r = random.Random(f"{self.seed}/{n}")
        self.aliases = 0
        shapes = [("agg", 24), ("global_agg", 6), ("stats", 5), ("rows", 9), ("window_agg", 14), ("join_agg", 12),
                  ("setop", 8), ("cte", 14), ("window_rows", 6), ("subquery", 4)]
        shape = self.pick_w(shapes)
        q = getattr(self, "shape_" + shape)()
        return GenCase(n, shape, q)

    def pick(self, xs):
        return xs[self.r.randrange(len(xs))]

    def pick_w(self, pairs):
        total = sum(w for _, w in pairs)
        x = self.r.uniform(0, total)
        for v, w in pairs:
            x -= w
            if x <= 0:
                return v
        return pairs[-1][0]

    def chance(self, p):
        return self.r.random() < p

    def fresh(self, prefix):
        self.aliases += 1
        return f"{prefix}{self.aliases}"

    # ------------------------------------------------------------ sources

    def events_table(self):
        weights = []
        for t in self.events:
            if t.name == "glass.events":
                weights.append((t, 50))
            elif all(p[1] for p in t.physical):
                weights.append((t, 35))
            else:
                weights.append((t, 4))  # a version with no data yet
        return self.pick_w(weights)

    def base(self, table=None):
        table = table or self.events_table()
        alias = self.fresh("t")
        cols = [CRef(Col(alias, c.name, c.t), c.t, c.role, c.nullable, False, c.name) for c in table.columns]
        by = {c.name: c for c in cols}
        scope = Scope(cols, [by[u] for u in table.unique], table.kind, by.get("timestamp"))
        return TableSrc(table.name, alias), scope

    def derived_scope(self, q, alias, kind, unique_aliases=(), ts_alias=None):
        cols = []
        for it in q.out():
            src = getattr(it, "_ref", None)
            cols.append(CRef(Col(alias, it.alias, it.e.t, it.e.ix), it.e.t,
                             src.role if src else role_for(it.e), True, it.e.ix, src.name if src else ""))
        by = {c.e.name: c for c in cols}
        return Scope(cols, [by[a] for a in unique_aliases if a in by], kind, by.get(ts_alias))

    # ------------------------------------------------------------ values

    def lit_for(self, c):
        """A literal to compare column c with: a sampled value mostly."""
        t = c.t
        if t == "str":
            vals = self.values.get(c.name) or []
            if vals and self.chance(0.8):
                return Lit(self.pick(vals), "str")
            return Lit(self.pick(EXTRA_STR), "str")
        if t == "int":
            vals = self.values.get(c.name) or []
            if vals and self.chance(0.6):
                return Lit(int(self.pick(vals)), "int")
            return Lit(self.pick([0, 1, 2, 3, 5, 10, -1, 100, 2147483647, 2147483648]), "int")
        if t == "float":
            vals = self.values.get(c.name) or []
            if vals and self.chance(0.5):
                return Lit(float(self.pick(vals)), "float")
            return Lit(self.pick([0.0, -0.0, 1.5, 50.0, 100.0, 0.1, -1.0, 1e308, float("inf"), 25.25]), "float")
        if t == "ts":
            return Lit(self.ts_value(), "ts")
        if t == "bool":
            return Lit(self.chance(0.5), "bool")
        if t == "date":
            return Lit(self.ts_value()[:10], "date")
        raise ValueError(t)

    def ts_value(self):
        vals = self.values.get("timestamp") or ["2026-08-03 00:00:00"]
        v = self.pick(vals)
        if self.chance(0.4):
            v = v[:10] + " 00:00:00"  # a day boundary
        return v

    def str_lit(self):
        return Lit(self.pick(EXTRA_STR + [v for v in self.values.get("event", [])[:8]]), "str")

    # ------------------------------------------------------------ scalar expressions

    def col(self, scope, t, roles=None, exact=True):
        cs = scope.of(t, roles, exact)
        return self.pick(cs) if cs else None

    def scalar(self, scope, t, depth=0):
        """An expression of type t over scope, no aggregates."""
        for _ in range(6):
            e = self._scalar(scope, t, depth)
            if e is not None:
                return e
        return Lit(None, t)

    def _scalar(self, scope, t, depth):
        r = self.r.random()
        deep = depth < 2
        if t == "bool":
            return self.pred(scope, depth)
        c = self.col(scope, t)
        if r < 0.45 or not deep:
            if c is None:
                return None if deep else self.lit_for(CRef(None, t, "", name=""))
            return c.e
        if t == "str":
            return self.str_expr(scope, depth)
        if t == "int":
            return self.int_expr(scope, depth)
        if t == "float":
            return self.float_expr(scope, depth)
        if t == "ts":
            return self.ts_expr(scope, depth)
        if t == "date":
            ts = self.col(scope, "ts")
            return Cast(ts.e, "date") if ts else None
        return None

    def str_expr(self, scope, depth):
        k = self.pick_w([("fn", 3), ("json", 3), ("concat", 2), ("coalesce", 2), ("case", 2), ("substr", 2),
                         ("nullif", 1), ("cast", 1), ("split", 1)])
        s = lambda: self.scalar(scope, "str", depth + 1)
        if k == "fn":
            return Call(self.pick(["lower", "upper", "trim", "reverse"]), [s()], "str")
        if k == "json":
            return self.json_get(scope, "str")
        if k == "concat":
            if self.chance(0.5):
                return Bin("||", s(), self.pick([s(), self.str_lit()]), "str")
            return Call("concat", [s(), self.str_lit(), s()], "str")
        if k == "coalesce":
            return Call("coalesce", [s(), self.pick([s(), self.str_lit()])], "str")
        if k == "case":
            return Case([When(self.pred(scope, depth + 1), s())], self.pick([s(), None]), "str")
        if k == "substr":
            if self.chance(0.5):
                return Call("substr", [s(), Lit(self.r.randint(1, 5), "int"), Lit(self.r.randint(0, 6), "int")], "str")
            return Call(self.pick(["left", "right"]), [s(), Lit(self.r.randint(0, 8), "int")], "str")
        if k == "nullif":
            return Call("nullif", [s(), self.str_lit()], "str")
        if k == "cast":
            i = self.col(scope, "int")
            return Cast(i.e if i else self.scalar(scope, "int", depth + 1), "str")
        if k == "split":
            return Call("split_part", [s(), Lit(self.pick(["/", "_", "."]), "str"), Lit(self.r.randint(1, 4), "int")], "str")

    def json_get(self, scope, t):
        js = scope.of("str", ["json"])
        if not js:
            return None
        c = self.pick(js)
        keys = JSON_KEYS.get(c.name) or {"plan": "str"}
        matching = [k for k, kt in keys.items() if kt == t] or list(keys)
        # mostly a key of the wanted type, sometimes one of another type (NULL in both engines)
        key = self.pick(matching) if self.chance(0.85) else self.pick(list(keys) + ["missing"])
        fn = {"str": "json_get_str", "int": "json_get_int", "float": "json_get_float", "bool": "json_get_bool"}[t]
        return Call(fn, [c.e, Lit(key, "str")], t)

    def int_expr(self, scope, depth):
        k = self.pick_w([("len", 2), ("extract", 3), ("json", 3), ("arith", 3), ("div", 1), ("case", 1),
                         ("coalesce", 1), ("strpos", 1)])
        i = lambda: self.scalar(scope, "int", depth + 1)
        if k == "len":
            return Call("char_length", [self.scalar(scope, "str", depth + 1)], "int")
        if k == "extract":
            ts = self.col(scope, "ts")
            if ts is None:
                return None
            return Cast(Call("extract", [self.pick(EXTRACT_FIELDS), ts.e], "int"), "int")
        if k == "json":
            return self.json_get(scope, "int")
        if k == "arith":
            return Bin(self.pick(["+", "-", "*", "%"]), i(), Lit(self.r.randint(1, 7), "int"), "int")
        if k == "div":
            # a literal divisor mostly; a column may be 0, where the engines differ (known.py)
            d = Lit(self.r.randint(1, 7), "int") if self.chance(0.8) else i()
            return Bin("/", i(), d, "int")
        if k == "case":
            return Case([When(self.pred(scope, depth + 1), i())], Lit(self.r.randint(-1, 3), "int"), "int")
        if k == "coalesce":
            return Call("coalesce", [i(), Lit(0, "int")], "int")
        if k == "strpos":
            return Cast(Call("strpos", [self.scalar(scope, "str", depth + 1), Lit(self.pick(["a", "/", "_", "e"]), "str")], "int"), "int")

    def float_expr(self, scope, depth):
        k = self.pick_w([("json", 3), ("arith", 3), ("round", 2), ("abs", 1), ("cast", 2), ("coalesce", 1),
                         ("case", 1)])
        f = lambda: self.scalar(scope, "float", depth + 1)
        if k == "json":
            return self.json_get(scope, "float")
        if k == "arith":
            return Bin(self.pick(["+", "-", "*"]), f(), Lit(self.pick([1.5, 2.0, 0.5, -1.0, 100.0]), "float"), "float")
        if k == "round":
            return Call("round", [f(), Lit(self.r.randint(0, 2), "int", plain=True)], "float")
        if k == "abs":
            return Call("abs", [f()], "float")
        if k == "cast":
            return Cast(self.scalar(scope, "int", depth + 1), "float")
        if k == "coalesce":
            return Call("coalesce", [f(), Lit(0.0, "float")], "float")
        if k == "case":
            return Case([When(self.pred(scope, depth + 1), f())], self.pick([f(), None]), "float")

    def ts_expr(self, scope, depth):
        ts = self.col(scope, "ts")
        if ts is None:
            return None
        k = self.pick_w([("trunc", 4), ("bin", 3), ("plus", 2)])
        if k == "trunc":
            return Call("date_trunc", [Lit(self.pick(DATE_UNITS), "str"), ts.e], "ts")
        if k == "bin":
            return Call("date_bin", [Interval(self.pick(BINS)), ts.e, Lit(self.pick(ORIGINS), "ts")], "ts")
        return Bin(self.pick(["+", "-"]), ts.e, Interval(self.pick(["1 hour", "1 day", "90 minutes"])), "ts")

    # ------------------------------------------------------------ predicates (often NULL on some rows)

    def pred(self, scope, depth=0):
        k = self.pick_w([("cmp", 8), ("null", 2), ("in", 2), ("between", 1), ("like", 2), ("bool", 2 if depth < 2 else 0),
                         ("not", 1 if depth < 2 else 0), ("distinct", 1), ("colcmp", 2), ("json", 2)])
        if k == "cmp":
            t = self.pick_w([("str", 4), ("int", 2), ("float", 2), ("ts", 2)])
            c = self.col(scope, t)
            if c is None:
                return self.pred_null(scope)
            e = c.e if self.chance(0.7) else self.scalar(scope, t, depth + 1)
            return Bin(self.pick(["=", "<>", "<", "<=", ">", ">="]), e, self.lit_for(c), "bool")
        if k == "null":
            if self.chance(0.3) and depth < 2:
                # a truth test: never NULL itself, of a predicate that may be
                return Un(self.pick(["IS TRUE", "IS NOT TRUE", "IS FALSE", "IS NOT FALSE", "IS UNKNOWN"]),
                          self.pred(scope, depth + 1), "bool")
            return self.pred_null(scope)
        if k == "in":
            c = self.col(scope, "str") or self.col(scope, "int")
            if c is None:
                return self.pred_null(scope)
            items = [self.lit_for(c) for _ in range(self.r.randint(1, 4))]
            if self.chance(0.25):
                items.append(Lit(None, c.t))
            return In(c.e, items, self.chance(0.3))
        if k == "between":
            t = self.pick(["ts", "float", "int"])
            c = self.col(scope, t) or self.col(scope, "ts")
            if c is None:
                return self.pred_null(scope)
            a, b = self.lit_for(c), self.lit_for(c)
            return Between(c.e, a, b, self.chance(0.2))
        if k == "like":
            c = self.col(scope, "str")
            if c is None:
                return self.pred_null(scope)
            return Like(c.e, self.pick(LIKE_PATTERNS), self.chance(0.25), self.chance(0.2))
        if k == "bool":
            return Bin(self.pick(["AND", "OR"]), self.pred(scope, depth + 1), self.pred(scope, depth + 1), "bool")
        if k == "not":
            return Un("NOT", self.pred(scope, depth + 1), "bool")
        if k == "distinct":
            c = self.col(scope, "str")
            if c is None:
                return self.pred_null(scope)
            return Bin(self.pick(["IS DISTINCT FROM", "IS NOT DISTINCT FROM"]), c.e,
                       self.pick([self.lit_for(c), Lit(None, "str")]), "bool")
        if k == "colcmp":
            t = self.pick(["str", "str", "ts", "float", "int"])
            cs = scope.of(t, exact=True)
            if len(cs) < 2:
                return self.pred_null(scope)
            a, b = self.r.sample(cs, 2)
            return Bin(self.pick(["=", "<>", "<", ">="]), a.e, b.e, "bool")
        if k == "json":
            e = self.json_get(scope, self.pick(["str", "int", "float"]))
            if e is None:
                return self.pred_null(scope)
            lit = {"str": Lit(self.pick(["pro", "USD", "api", "home", ""]), "str"),
                   "int": Lit(self.r.randint(0, 5), "int"), "float": Lit(self.pick([10.0, 50.0, 0.0]), "float")}[e.t]
            return Bin(self.pick(["=", "<>", ">", "<"]), e, lit, "bool")

    def pred_null(self, scope):
        cs = [c for c in scope.cols if c.nullable and not c.ix] or scope.cols
        c = self.pick(cs)
        return Un(self.pick(["IS NULL", "IS NOT NULL"]), c.e, "bool")

    # ------------------------------------------------------------ aggregates

    def agg(self, scope, allow_order=True):
        k = self.pick_w([("count_star", 6), ("count", 2), ("count_distinct", 2), ("sum", 3), ("avg", 2),
                         ("minmax", 3), ("approx", 1), ("stddev", 1), ("median", 1), ("string_agg", 1),
                         ("bool", 1), ("ordered", 0.4 if allow_order else 0)])
        filt = self.pred(scope, 1) if self.chance(0.3) else None
        if k == "count_star":
            return Agg("count", [], "int", filt=self.pred(scope, 1) if self.chance(0.5) else filt)
        if k == "count":
            return Agg("count", [self.any_scalar(scope)], "int", filt=filt)
        if k == "count_distinct":
            t = self.pick(["str", "str", "int", "ts"])
            return Agg("count", [self.scalar(scope, t, 1)], "int", distinct=True, filt=filt)
        if k in ("sum", "avg"):
            t = self.pick(["int", "float", "float"])
            e = self.scalar(scope, t, 1)
            ix = e.t == "float" or k == "avg"
            if k == "sum" and e.t == "int":
                return Agg("sum", [e], "int", filt=filt)
            return Agg(k, [e], "float", filt=filt, ix=ix)
        if k == "minmax":
            t = self.pick(["str", "int", "float", "ts"])
            e = self.scalar(scope, t, 1)
            return Agg(self.pick(["min", "max"]), [e], e.t, filt=filt, ix=e.ix)
        if k == "approx":
            return Agg("approx_distinct", [self.scalar(scope, self.pick(["str", "int"]), 1)], "int", filt=filt)
        if k == "stddev":
            return Agg(self.pick(["stddev", "var_samp", "stddev_pop"]), [self.scalar(scope, "float", 1)], "float",
                       filt=filt, ix=True)
        if k == "median":
            return Agg("median", [self.scalar(scope, "float", 1)], "float", filt=filt)
        if k == "string_agg":
            # of a column with few values, DISTINCT mostly: a string per group, not a megabyte
            low = scope.of("str", ["lowcard"], exact=True)
            if not low:
                return Agg("count", [], "int", filt=filt)
            e = self.pick(low).e
            if self.chance(0.3):
                e = Call(self.pick(["lower", "upper", "trim"]), [e], "str")
            return Agg("string_agg", [e], "str", distinct=self.chance(0.7), filt=filt,
                       order=[OrderExpr(e, self.chance(0.3))], extra=[Lit(self.pick([",", "", " | "]), "str")])
        if k == "bool":
            return Agg(self.pick(["bool_and", "bool_or"]), [self.pred(scope, 1)], "bool", filt=filt)
        if k == "ordered":
            # an aggregate with ORDER BY that does not depend on it (issue 40, item 5)
            e = self.scalar(scope, "float", 1)
            return Agg(self.pick(["avg", "sum", "stddev", "max"]), [e], "float", filt=filt, ix=True,
                       order=[OrderExpr(self.any_scalar(scope), self.chance(0.5))])

    def any_scalar(self, scope):
        return self.scalar(scope, self.pick(["str", "str", "int", "float", "ts"]), 1)

    # ------------------------------------------------------------ windows

    def window(self, scope):
        part = []
        keys = scope.of("str", ["lowcard", "highcard"], exact=True)
        for _ in range(self.pick([0, 1, 1, 1, 2])):
            if keys:
                part.append(self.pick(keys).e)
        total = [OrderExpr(c.e) for c in ([scope.ts] if scope.ts else []) + scope.unique]
        k = self.pick_w([("row_number", 2), ("rank", 2), ("lag", 5), ("running", 4), ("range", 2),
                         ("partition_agg", 2), ("first_last", 2), ("ntile", 1)])
        if k == "row_number":
            return Win("row_number", [], "int", part, total)
        if k == "rank":
            c = self.pick(scope.of(exact=True))
            return Win(self.pick(["rank", "dense_rank", "cume_dist", "percent_rank"]), [], "int", part,
                       [OrderExpr(c.e, self.chance(0.5), self.pick([None, True, False]))])._fix()
        if k == "lag":
            t = self.pick(["str", "str", "int", "float", "ts"])
            x = self.scalar(scope, t, 1)
            args = [x]
            if self.chance(0.6):
                args.append(Lit(self.pick([1, 1, 2, 3]), "int"))
                if self.chance(0.5):
                    args.append(self.lit_for(CRef(None, x.t, "", name="")))
            return Win(self.pick(["lag", "lead"]), args, x.t, part, total, ignore_nulls=self.chance(0.25))
        if k == "running":
            t = self.pick(["int", "float"])
            x = self.scalar(scope, t, 1)
            fn = self.pick(["sum", "count", "min", "max", "avg"])
            frame = self.pick([None, Frame("ROWS", "UNBOUNDED PRECEDING", "CURRENT ROW"),
                               Frame("ROWS", "2 PRECEDING", "CURRENT ROW"), Frame("ROWS", "1 PRECEDING", "1 FOLLOWING"),
                               Frame("ROWS", "CURRENT ROW", "UNBOUNDED FOLLOWING")])
            rt = "int" if fn == "count" or (fn in ("sum", "min", "max") and x.t == "int") else x.t
            if fn == "avg":
                rt = "float"
            ix = rt == "float" and fn in ("sum", "avg")
            return Win(fn, [x], rt, part, total, frame, ix=ix)
        if k == "range":
            ts = scope.ts
            x = self.scalar(scope, self.pick(["int", "float"]), 1)
            fn = self.pick(["sum", "count", "max"])
            rt = "int" if fn == "count" or x.t == "int" else "float"
            if ts is not None and self.chance(0.7):
                frame = Frame("RANGE", f"INTERVAL '{self.pick(['1 hour', '1 day', '30 minutes'])}' PRECEDING",
                              self.pick(["CURRENT ROW", "INTERVAL '1 hour' FOLLOWING"]))
                return Win(fn, [x], rt, part, [OrderExpr(ts.e)], frame, ix=rt == "float" and fn == "sum")
            num = self.col(scope, self.pick(["int", "float"]))
            if num is None:
                return Win("count", [], "int", part)
            frame = Frame("RANGE", self.pick(["UNBOUNDED PRECEDING", "5 PRECEDING", "CURRENT ROW"]),
                          self.pick(["CURRENT ROW", "10 FOLLOWING", "UNBOUNDED FOLLOWING"]))
            if frame.start == "CURRENT ROW" and frame.end == "CURRENT ROW":
                frame.end = "UNBOUNDED FOLLOWING"
            return Win(fn, [x], rt, part, [OrderExpr(num.e, self.chance(0.3), self.pick([None, True, False]))], frame,
                       ix=rt == "float" and fn == "sum")
        if k == "partition_agg":
            if self.chance(0.5):
                return Win("count", [], "int", part)
            x = self.scalar(scope, self.pick(["int", "float", "str"]), 1)
            fn = self.pick(["min", "max", "count"])
            return Win(fn, [x], "int" if fn == "count" else x.t, part, ix=x.ix and fn != "count")
        if k == "first_last":
            x = self.scalar(scope, self.pick(["str", "int", "ts"]), 1)
            frame = self.pick([None, Frame("ROWS", "UNBOUNDED PRECEDING", "UNBOUNDED FOLLOWING"),
                               Frame("ROWS", "1 PRECEDING", "1 FOLLOWING")])
            return Win(self.pick(["first_value", "last_value"]), [x], x.t, part, total, frame,
                       ignore_nulls=self.chance(0.3))
        return Win("ntile", [Lit(self.r.randint(2, 5), "int")], "int", part, total)

    # ------------------------------------------------------------ selects

    def group_keys(self, scope, n):
        keys = []
        for _ in range(n):
            r = self.r.random()
            low = scope.of("str", ["lowcard"], exact=True)
            if r < 0.55 and low:
                keys.append(self.pick(low).e)
            elif r < 0.7 and scope.ts is not None:
                keys.append(self.pick([Call("date_trunc", [Lit(self.pick(["day", "week"]), "str"), scope.ts.e], "ts"),
                                       Cast(Call("extract", [self.pick(["hour", "dow"]), scope.ts.e], "int"), "int"),
                                       Call("date_bin", [Interval(self.pick(["1 day", "7 days", "6 hours"])), scope.ts.e,
                                                         Lit(self.pick(ORIGINS), "ts")], "ts")]))
            elif r < 0.8:
                j = self.json_get(scope, "str")
                keys.append(j if j is not None else self.scalar(scope, "str", 1))
            elif r < 0.9:
                c = self.col(scope, self.pick(["str", "int", "bool"]), ["lowcard", "num", "bool"])
                keys.append(c.e if c else self.scalar(scope, "str", 1))
            else:
                keys.append(self.scalar(scope, self.pick(["str", "int"]), 1))
        # no key twice
        seen, out = set(), []
        for k in keys:
            text = k.render("df")
            if text not in seen and not k.ix:
                seen.add(text)
                out.append(k)
        return out

    def few_values(self, scope, e):
        """Whether grouping by e gives few groups: a low-cardinality column, a time bucket of a
        day or more, an hour or weekday, a JSON string (its keys hold few values)."""
        low = {c.e.render("df") for c in scope.cols if c.role in ("lowcard", "bool")}
        if e.render("df") in low:
            return True
        if isinstance(e, Cast) and isinstance(e.e, Call) and e.e.fn == "extract":
            return True
        if isinstance(e, Call) and (e.fn in ("date_trunc", "json_get_str") or
                                    (e.fn == "date_bin" and e.args[0].text in ("1 day", "7 days", "6 hours"))):
            return True
        return False

    def agg_select(self, src, scope, joins=(), n_keys=None, top=True, allow_window=True):
        n_keys = self.pick([0, 1, 1, 2, 2, 3]) if n_keys is None else n_keys
        keys = self.group_keys(scope, n_keys)
        mode = "plain"
        sets = []
        if keys and self.chance(0.3):
            mode = self.pick(["rollup", "cube", "sets"])
            if mode == "sets":
                idx = list(range(len(keys)))
                sets = [sorted(self.r.sample(idx, self.r.randint(0, len(idx)))) for _ in range(self.r.randint(1, 3))]
                sets.append(idx)
                if self.chance(0.9):
                    # the same set twice, sometimes: a grand total per copy (DuckDB, PostgreSQL)
                    sets = [s for n, s in enumerate(sets) if s not in sets[:n]]
        items = [Item(k, f"c{i}") for i, k in enumerate(keys)]
        by_text = {c.e.render("df"): c for c in scope.cols}
        for it in items:
            ref = by_text.get(it.e.render("df"))
            if ref is not None:
                it._ref = ref
            elif not self.few_values(scope, it.e):
                it._ref = CRef(None, it.e.t, "highcard")
        for _ in range(self.r.randint(1, 4)):
            items.append(Item(self.agg(scope), f"c{len(items)}"))
        if mode != "plain" and self.chance(0.5):
            items.append(Item(Call("grouping", [self.pick(keys)], "int"), f"c{len(items)}"))
        if allow_window and keys and self.chance(0.12):
            count = Agg("count", [], "int")
            w = self.pick([Win("rank", [], "int", [], [OrderExpr(count, True)]),
                           Win("sum", [count], "int", [keys[0]] if mode == "plain" else [], [])])
            items.append(Item(w, f"c{len(items)}"))
        where = [self.pred(scope) for _ in range(self.pick([0, 1, 1, 2]))]
        having = []
        if keys and self.chance(0.15):
            having.append(Bin(self.pick([">", ">=", "<"]), Agg("count", [], "int",
                              filt=self.pred(scope, 1) if self.chance(0.3) else None),
                              Lit(self.pick([1, 2, 5, 10]), "int"), "bool"))
        q = Select(items, src, list(joins), where, GroupBy(mode, keys, sets) if keys else None, having)
        many = len(keys) > 2 or not all(self.few_values(scope, k) for k in keys)
        if top:
            self.top_order(q, limit_p=(1.0 if many else 0.35) if keys else 0)
            if many and q.limit is None:
                # a group per device or session: keep the answer small
                q.order = [OrderKey(i.alias, self.chance(0.5), self.pick([None, True, False]))
                           for i in q.items if not i.e.ix]
                q.limit = self.pick([5, 20, 50])
        q._many = many
        return q

    def top_order(self, q, limit_p=0.35):
        """An ORDER BY (maybe with ties) and LIMIT for a top-level query."""
        exact = [i for i in q.out() if not i.e.ix]
        if exact and self.chance(limit_p):
            ks = self.r.sample(exact, self.r.randint(1, min(3, len(exact))))
            q.order = [OrderKey(i.alias, self.chance(0.5), self.pick([None, True, False])) for i in ks]
            q.limit = self.pick([1, 3, 5, 10, 20])
        elif exact and self.chance(0.1):
            q.order = [OrderKey(i.alias, self.chance(0.5), self.pick([None, True, False])) for i in exact]

    def total_order(self, q):
        """ORDER BY every exact output column: a LIMIT below the top then keeps the same rows in
        any correct engine (rows equal in those columns are equal)."""
        q.order = [OrderKey(i.alias, self.chance(0.3), self.pick([True, False])) for i in q.out() if not i.e.ix]

    def window_select(self, src, scope, n_windows=None):
        """SELECT a few columns and window functions of a base table."""
        keep = list(scope.unique)
        if scope.ts is not None:
            keep.append(scope.ts)
        others = [c for c in scope.cols if c not in keep]
        keep += self.r.sample(others, min(len(others), self.r.randint(2, 5)))
        items = []
        for i, c in enumerate(keep):
            it = Item(c.e, f"c{i}")
            it._ref = c
            items.append(it)
        for _ in range(n_windows or self.r.randint(1, 3)):
            w = self.window(scope)
            if w.fn in ("row_number", "rank", "dense_rank", "ntile") and self.chance(0.85):
                # DataFusion's ranking functions give UInt64; UInt64 - Int64 is a DECIMAL there, whose
                # avg keeps 4 decimals (known.py): BIGINT mostly, as a user would cast it
                w = Cast(w, "int")
            items.append(Item(w, f"c{len(items)}"))
        where = [self.pred(scope) for _ in range(self.pick([0, 0, 1]))]
        q = Select(items, src, [], where)
        unique = [items[keep.index(u)].alias for u in scope.unique]
        ts = items[keep.index(scope.ts)].alias if scope.ts is not None else None
        return q, unique, ts

    # ------------------------------------------------------------ shapes

    def shape_agg(self):
        src, scope = self.base()
        return self.agg_select(src, scope)

    def shape_global_agg(self):
        src, scope = self.base()
        return self.agg_select(src, scope, n_keys=0)

    def shape_stats(self):
        """What metadata could answer: count(*), min and max of plain columns, under conditions
        on the columns data files have bounds for (times, strings past the 16 bytes bounds keep,
        doubles with NaN)."""
        src, scope = self.base()
        items = []
        for _ in range(self.r.randint(1, 4)):
            c = self.pick([c for c in scope.cols if c.role != "json"])
            fn = self.pick(["min", "max", "count", "count_star"])
            if fn == "count_star":
                items.append(Agg("count", [], "int"))
            else:
                items.append(Agg(fn, [c.e], "int" if fn == "count" else c.t))
        where = []
        for _ in range(self.pick([0, 0, 1, 2])):
            c = self.pick([c for c in scope.cols if c.role in ("ts", "lowcard", "num", "highcard")])
            op = self.pick(["=", "<", ">=", "<>"])
            where.append(Bin(op, c.e, self.lit_for(c), "bool") if self.chance(0.8) else Un("IS NULL", c.e, "bool"))
        return Select([Item(a, f"c{i}") for i, a in enumerate(items)], src, [], where)

    def shape_rows(self):
        src, scope = self.base()
        items = [Item(c.e, f"c{i}") for i, c in enumerate(scope.unique)]
        for _ in range(self.r.randint(1, 4)):
            items.append(Item(self.any_scalar(scope) if self.chance(0.6) else self.pick(scope.cols).e, f"c{len(items)}"))
        where = [self.pred(scope) for _ in range(self.r.randint(1, 2))]
        q = Select(items, src, [], where)
        if self.chance(0.5):
            q.order = [OrderKey(i.alias, self.chance(0.4), self.pick([None, True, False])) for i in items[:len(scope.unique)]]
        else:
            # a non-unique key first: ties, compared run by run
            extra = [i for i in items[len(scope.unique):] if not i.e.ix]
            ks = self.r.sample(extra, min(len(extra), 2))
            q.order = [OrderKey(i.alias, self.chance(0.5), self.pick([None, True, False])) for i in ks] or \
                [OrderKey(items[0].alias)]
        q.limit = self.pick([1, 5, 10, 30])
        return q

    def shape_window_rows(self):
        src, scope = self.base()
        q, unique, _ = self.window_select(src, scope)
        q.where.append(self.pred(scope))
        q.order = [OrderKey(a, self.chance(0.5)) for a in unique]
        q.limit = self.pick([5, 10, 25])
        return q

    def shape_window_agg(self):
        src, scope = self.base()
        inner, unique, ts = self.window_select(src, scope)
        alias = self.fresh("w")
        wscope = self.derived_scope(inner, alias, scope.kind, unique, ts)
        outer = self.agg_select(SubSrc(inner, alias), wscope, n_keys=self.pick([0, 1, 1, 2]))
        # the shape: a FILTER on a comparison with a window's result
        wins = [c for c, it in zip(wscope.cols, inner.items) if isinstance(it.e, (Win, Cast)) and not c.ix]
        if wins and self.chance(0.6):
            w = self.pick(wins)
            peers = [c for c in wscope.cols if c.t == w.t and c is not w and not c.ix]
            other = self.pick(peers).e if peers else self.lit_for(w)
            outer.items.append(Item(Agg("count", [], "int", filt=Bin(self.pick(["=", "<>", "<"]), w.e, other, "bool")),
                                    f"c{len(outer.items)}"))
        return outer

    def identities_src(self):
        if not self.identities:
            return None
        t = self.pick(self.identities)
        if self.chance(0.25):
            # an aggregate of identities as the right side
            src, scope = self.base(t)
            dev = next(c for c in scope.cols if c.name == "device_id")
            items = [Item(dev.e, "device_id"), Item(Agg("count", [], "int"), "n"),
                     Item(Agg("max", [next(c for c in scope.cols if c.name == "person_id").e], "str"), "person_id")]
            items[0]._ref, items[2]._ref = dev, next(c for c in scope.cols if c.name == "person_id")
            q = Select(items, src, [], [], GroupBy("plain", [dev.e]))
            alias = self.fresh("i")
            return SubSrc(q, alias), self.derived_scope(q, alias, "identities", ["device_id"])
        return self.base(t)

    def join_on(self, lscope, rscope):
        ld = next((c for c in lscope.cols if c.name == "device_id"), None)
        rd = next((c for c in rscope.cols if c.name == "device_id"), None)
        on = [Bin("=", ld.e, rd.e, "bool")]
        if self.chance(0.25):
            lp = next((c for c in lscope.cols if c.name == "person_id"), None)
            rp = next((c for c in rscope.cols if c.name == "person_id"), None)
            if lp and rp:
                on.append(Bin(self.pick(["=", "<>"]), lp.e, rp.e, "bool"))
        if self.chance(0.15):
            on.append(self.pred(rscope, 1))
        return on

    def shape_join_agg(self):
        src, scope = self.base()
        right = self.identities_src()
        if right is None:
            return self.agg_select(src, scope)
        rsrc, rscope = right
        kind = self.pick_w([("INNER", 3), ("LEFT", 3), ("SEMI", 1), ("ANTI", 1), ("EXISTS", 1), ("IN", 1)])
        on = self.join_on(scope, rscope)
        if kind in ("EXISTS", "IN"):
            neg = self.chance(0.4)
            dev = next(c for c in scope.cols if c.name == "device_id")
            # Half the time the subquery filters a join: of the events (whose device it reads)
            # and another identities table (whose device the IN reads, some of the time).
            joins, outer = [], scope
            other = self.identities_src() if self.chance(0.5) else None
            if other is not None:
                osrc, oscope = other
                joins = [Join(self.pick(["INNER", "LEFT"]), osrc, self.join_on(scope, oscope))]
                outer = Scope(scope.cols + oscope.cols, scope.unique, "events", scope.ts)
                if kind == "IN" and self.chance(0.3):
                    dev = next(c for c in oscope.cols if c.name == "device_id")
            if kind == "EXISTS":
                sub = Select([Item(Lit(1, "int"), "one")], rsrc, [], on)
                cond = Exists(sub, neg)
            else:
                rd = next(c for c in rscope.cols if c.name == "device_id")
                sub = Select([Item(rd.e, "device_id")], rsrc, [], [self.pred(rscope, 1)] if self.chance(0.4) else [])
                cond = InSub(dev.e, sub, neg)
            q = self.agg_select(src, outer, joins)
            q.where.append(cond)
            return q
        joins = [Join(kind, rsrc, on)]
        both = scope if kind in ("SEMI", "ANTI") else Scope(scope.cols + rscope.cols, scope.unique, "events", scope.ts)
        return self.agg_select(src, both, joins)

    def setop_side(self, cols_by_name, scope, agg):
        items = []
        for i, name in enumerate(cols_by_name):
            c = next(c for c in scope.cols if c.name == name)
            items.append(Item(c.e, f"c{i}"))
            items[-1]._ref = c
        where = [self.pred(scope) for _ in range(self.pick([0, 1, 1]))]
        if agg:
            items.append(Item(Agg("count", [], "int", filt=self.pred(scope, 1) if self.chance(0.3) else None),
                              f"c{len(items)}"))
            return Select(items, None, [], where, GroupBy("plain", [i.e for i in items[:-1]]))
        return Select(items, None, [], where)

    def shape_setop(self):
        op = self.pick(["UNION", "UNION ALL", "INTERSECT", "EXCEPT", "INTERSECT ALL", "EXCEPT ALL"])
        agg = op.endswith("ALL") or self.chance(0.3)
        t1, t2 = self.events_table(), self.events_table()
        common = [c.name for c in t1.columns if c.role == "lowcard" and t2.col(c.name) is not None]
        if self.identities and self.chance(0.2):
            t2 = self.pick(self.identities)
            common = [n for n in ("project_id", "device_id") if t2.col(n) is not None and t1.col(n) is not None]
            agg = agg or "device_id" in common
        if not common:
            return self.shape_agg()
        names = self.r.sample(common, min(len(common), self.r.randint(1, 2)))
        sides = []
        for t in (t1, t2):
            src, scope = self.base(t)
            s = self.setop_side(names, scope, agg)
            s.src = src
            sides.append(s)
        q = SetOp(op, sides[0], sides[1])
        if self.chance(0.4) or "device_id" in names:
            alias = self.fresh("s")
            scope = self.derived_scope(q, alias, "setop")
            outer = self.agg_select(SubSrc(q, alias), scope, n_keys=self.pick([0, 1]), allow_window=False)
            return outer
        self.top_order(q, 0.4)
        return q

    def cte_body(self):
        """A CTE with a GROUP BY or a PARTITION BY, and the scope its consumers see."""
        src, scope = self.base()
        if self.chance(0.55):
            q = self.agg_select(src, scope, n_keys=self.pick([1, 1, 2]), top=False, allow_window=self.chance(0.3))
            if q.group is None:
                q = self.agg_select(src, scope, n_keys=1, top=False)
            return q, None, None
        q, unique, ts = self.window_select(src, scope, self.r.randint(1, 2))
        return q, unique, ts

    def shape_cte(self):
        body, unique, ts = self.cte_body()
        name = self.fresh("cte")
        uses = []

        def use():
            alias = self.fresh("u")
            return TableSrc(name, alias), self.derived_scope(body, alias, "cte", unique or (), ts)

        consumers = []
        for _ in range(self.r.randint(2, 4)):
            k = self.pick_w([("count", 2), ("agg", 3), ("limit_count", 3), ("self_join", 1), ("filter", 2),
                             ("limit_rows", 1)])
            src, scope = use()
            if k == "count":
                consumers.append(Sub(Select([Item(Agg("count", [], "int"), "n")], src), "int"))
            elif k == "agg":
                a = self.agg(scope, allow_order=False)
                consumers.append(Sub(Select([Item(a, "v")], src, [], [self.pred(scope, 1)] if self.chance(0.4) else []),
                                     a.t, ix=a.ix))
            elif k == "limit_count":
                # a consumer under LIMIT, which stops reading the shared result early (issue 40, item 3)
                inner = Select([Item(scope.cols[0].e, "x")], src, [], [], None, [], [], self.pick([1, 3, 10]))
                alias = self.fresh("l")
                consumers.append(Sub(Select([Item(Agg("count", [], "int"), "n")], SubSrc(inner, alias)), "int"))
            elif k == "self_join":
                # on a column that identifies a row of the CTE: a join on anything else can
                # multiply a million rows by a million
                keys = unique or [i.alias for i in body.items[:len(body.group.keys)]]
                want = self.pick(keys)
                key = next(c for c in scope.cols if c.e.name == want)
                src2, scope2 = use()
                key2 = next(c for c in scope2.cols if c.e.name == key.e.name)
                consumers.append(Sub(Select([Item(Agg("count", [], "int"), "n")], src,
                                            [Join(self.pick(["INNER", "LEFT"]), src2, [Bin("=", key.e, key2.e, "bool")])]),
                                     "int"))
            elif k == "filter":
                num = [c for c in scope.cols if c.t in ("int", "float") and not c.ix]
                if num:
                    c = self.pick(num)
                    src2, scope2 = use()
                    c2 = next(x for x in scope2.cols if x.e.name == c.e.name)
                    avg = Sub(Select([Item(Agg("avg", [c2.e], "float", ix=True), "a")], src2), "float", ix=True)
                    consumers.append(Sub(Select([Item(Agg("count", [], "int"), "n")], src, [],
                                                [Bin(">", c.e, avg, "bool")]), "int"))
                else:
                    consumers.append(Sub(Select([Item(Agg("count", [], "int", filt=self.pred(scope, 1)), "n")], src), "int"))
            else:
                # the largest of the first rows in an order: the same in any engine, ties or not
                c0 = self.pick([c for c in scope.cols if not c.ix])
                inner = Select([Item(c0.e, "x0")], src, order=[OrderKey("x0", self.chance(0.5), self.chance(0.5))],
                               limit=self.pick([1, 2, 5]))
                lalias = self.fresh("l")
                consumers.append(Sub(Select([Item(Agg("max", [Col(lalias, "x0", c0.t)], c0.t), "m")],
                                            SubSrc(inner, lalias)), c0.t))
        if self.chance(0.3):
            # rows of the CTE besides the scalar uses
            src, scope = use()
            exact = [c for c in scope.cols if not c.ix]
            items = [Item(c.e, f"c{i}") for i, c in enumerate(exact[:3])]
            items += [Item(e, f"c{len(items) + i}") for i, e in enumerate(consumers[:2])]
            q = Select(items, src)
            self.top_order(q, 0.6)
            if q.limit is None and (unique or getattr(body, "_many", False)):
                # a CTE of windows has a row per event: keep the answer small
                q.order = [OrderKey(i.alias) for i in items[:3]]
                q.limit = 10
            return With([Cte(name, body)], q)
        items = [Item(e, f"c{i}") for i, e in enumerate(consumers)]
        return With([Cte(name, body)], Select(items, None))

    def shape_subquery(self):
        """A scalar subquery in the select list and a comparison with one in WHERE."""
        src, scope = self.base()
        q = self.agg_select(src, scope, n_keys=self.pick([1, 2]), top=False, allow_window=False)
        src2, scope2 = self.base()
        a = Agg(self.pick(["count", "max", "min"]), [] if self.chance(0.3) else [self.scalar(scope2, "int", 1)], "int")
        if not a.args:
            a.fn = "count"
        sub = Sub(Select([Item(a, "v")], src2, [], [self.pred(scope2, 1)]), "int")
        q.items.append(Item(sub, f"c{len(q.items)}"))
        self.top_order(q, 0.3)
        return q


def role_for(e):
    if e.t == "str":
        return "lowcard"
    if e.t in ("int", "float"):
        return "num"
    return e.t


def _fix(self):
    """cume_dist and percent_rank give doubles."""
    if self.fn in ("cume_dist", "percent_rank"):
        self.t = "float"
    return self


Win._fix = _fix
