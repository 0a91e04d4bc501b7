"""Queries as Python objects, rendered to SQL for skiff (DataFusion's dialect, `df`) or for
DuckDB (`duck`). The reducer shrinks these objects, never SQL text.

Every expression carries its type `t` (str, int, float, ts, date, bool) and `ix`: True when
its value is a float whose low bits depend on the order of a summation (sum/avg/stddev of
doubles, running sums), which the comparison then allows a small relative tolerance.
"""
from dataclasses import dataclass, field, fields
import math

SQL_TYPES = {"str": "VARCHAR", "int": "BIGINT", "float": "DOUBLE", "ts": "TIMESTAMP", "bool": "BOOLEAN",
             "date": "DATE"}


class Node:
    def render(self, d):
        raise NotImplementedError


def quote_str(s):
    return "'" + s.replace("'", "''") + "'"


# ---------------------------------------------------------------- expressions

@dataclass
class Col(Node):
    qual: str
    name: str
    t: str
    ix: bool = False

    def render(self, d):
        name = self.name if self.name.isidentifier() and self.name.islower() and self.name not in RESERVED \
            else '"' + self.name + '"'
        return f"{self.qual}.{name}" if self.qual else name


RESERVED = {"timestamp", "event", "items", "user", "order", "group", "value", "key", "year", "month", "day",
            "hour", "date", "time", "end", "start", "partition", "range", "rows"}


@dataclass
class Lit(Node):
    v: object
    t: str
    ix: bool = False
    plain: bool = False  # an INTEGER in DuckDB too (round's digits)

    def render(self, d):
        v, t = self.v, self.t
        if v is None:
            return f"CAST(NULL AS {SQL_TYPES[t]})"
        if t == "str":
            return quote_str(v)
        if t == "bool":
            return "TRUE" if v else "FALSE"
        if t == "int":
            if d == "duck" and not self.plain:
                # DuckDB types 2147483647 as INTEGER (and 2147483647 * 3 overflows), DataFusion as BIGINT
                return f"CAST({v} AS BIGINT)"
            return f"({v})" if v < 0 else str(v)
        if t == "float":
            if math.isnan(v) or math.isinf(v):
                return f"CAST('{'NaN' if math.isnan(v) else ('inf' if v > 0 else '-inf')}' AS DOUBLE)"
            text = repr(float(v))
            # DuckDB reads 1.5 as DECIMAL; DataFusion as DOUBLE: say DOUBLE for DuckDB
            return f"CAST({text} AS DOUBLE)" if d == "duck" else (f"({text})" if v < 0 else text)
        if t == "ts":
            return f"TIMESTAMP '{v}'"
        if t == "date":
            return f"DATE '{v}'"
        raise ValueError(t)


# name -> (DataFusion spelling, DuckDB spelling); {0}, {1} are the rendered arguments
FUNCS = {
    "date_bin": ("date_bin({0}, {1}, {2})", "time_bucket({0}, {1}, {2})"),
    "approx_distinct": ("approx_distinct({0})", "approx_count_distinct({0})"),
    "char_length": ("char_length({0})", "length({0})"),
}


@dataclass
class Call(Node):
    fn: str
    args: list
    t: str
    ix: bool = False

    def render(self, d):
        args = [a.render(d) if isinstance(a, Node) else a for a in self.args]
        if self.fn in FUNCS:
            return FUNCS[self.fn][0 if d == "df" else 1].format(*args)
        if self.fn == "extract":
            return f"extract({args[0]} FROM {args[1]})"
        return f"{self.fn}({', '.join(args)})"


@dataclass
class Interval(Node):
    text: str   # '1 hour'
    t: str = "interval"
    ix: bool = False

    def render(self, d):
        return f"INTERVAL '{self.text}'"


@dataclass
class Bin(Node):
    op: str
    l: Node
    r: Node
    t: str
    ix: bool = False

    def render(self, d):
        op = self.op
        if op == "/" and d == "duck" and self.l.t == "int" and self.r.t == "int":
            op = "//"  # DataFusion's integer division truncates; DuckDB's `/` gives a double
        return f"({self.l.render(d)} {op} {self.r.render(d)})"


@dataclass
class Un(Node):
    op: str       # NOT, -, IS NULL, IS NOT NULL
    e: Node
    t: str
    ix: bool = False

    def render(self, d):
        if self.op.startswith("IS "):
            return f"({self.e.render(d)} {self.op})"
        return f"({self.op} {self.e.render(d)})"


@dataclass
class In(Node):
    e: Node
    items: list
    neg: bool = False
    t: str = "bool"
    ix: bool = False

    def render(self, d):
        return f"({self.e.render(d)} {'NOT IN' if self.neg else 'IN'} ({', '.join(i.render(d) for i in self.items)}))"


@dataclass
class Between(Node):
    e: Node
    lo: Node
    hi: Node
    neg: bool = False
    t: str = "bool"
    ix: bool = False

    def render(self, d):
        return f"({self.e.render(d)} {'NOT ' if self.neg else ''}BETWEEN {self.lo.render(d)} AND {self.hi.render(d)})"


@dataclass
class Like(Node):
    e: Node
    pat: str
    neg: bool = False
    ci: bool = False
    t: str = "bool"
    ix: bool = False

    def render(self, d):
        op = ("NOT " if self.neg else "") + ("ILIKE" if self.ci else "LIKE")
        # DataFusion's LIKE takes a backslash as its escape; DuckDB's has none unless told
        esc = " ESCAPE '\\'" if d == "duck" and "\\" in self.pat else ""
        return f"({self.e.render(d)} {op} {quote_str(self.pat)}{esc})"


@dataclass
class When(Node):
    cond: Node
    val: Node


@dataclass
class Case(Node):
    whens: list
    els: object  # Node or None
    t: str
    ix: bool = False

    def render(self, d):
        parts = " ".join(f"WHEN {w.cond.render(d)} THEN {w.val.render(d)}" for w in self.whens)
        els = f" ELSE {self.els.render(d)}" if self.els is not None else ""
        return f"CASE {parts}{els} END"


@dataclass
class Cast(Node):
    e: Node
    t: str
    ix: bool = False

    def render(self, d):
        return f"CAST({self.e.render(d)} AS {SQL_TYPES[self.t]})"


@dataclass
class OrderExpr(Node):
    e: Node
    desc: bool = False
    nulls_first: object = None  # None: the engine's default, which DuckDB is told explicitly

    def render(self, d):
        s = self.e.render(d) + (" DESC" if self.desc else "")
        nf = self.nulls_first
        if nf is None and d == "duck":
            nf = self.desc  # DataFusion's default: NULLs first under DESC, last under ASC
        if nf is not None:
            s += " NULLS FIRST" if nf else " NULLS LAST"
        return s


@dataclass
class Agg(Node):
    fn: str
    args: list           # [] means count(*)
    t: str
    distinct: bool = False
    filt: object = None  # Node
    order: list = field(default_factory=list)
    ix: bool = False
    extra: list = field(default_factory=list)  # literal trailing arguments (string_agg's separator)

    def render(self, d):
        if self.fn in FUNCS:
            inner = FUNCS[self.fn][0 if d == "df" else 1].format(*[a.render(d) for a in self.args])
            head, _, rest = inner.partition("(")
            body = rest[:-1]
        else:
            head = self.fn
            body = ", ".join([a.render(d) for a in self.args] + [e.render(d) for e in self.extra]) or "*"
        if self.distinct:
            body = "DISTINCT " + body
        if self.order:
            body += " ORDER BY " + ", ".join(o.render(d) for o in self.order)
        s = f"{head}({body})"
        if self.filt is not None:
            s += f" FILTER (WHERE {self.filt.render(d)})"
        return s


@dataclass
class Frame(Node):
    kind: str    # ROWS, RANGE
    start: str   # 'UNBOUNDED PRECEDING', '2 PRECEDING', 'CURRENT ROW', ...
    end: str

    def render(self, d):
        return f"{self.kind} BETWEEN {self.start} AND {self.end}"


@dataclass
class Win(Node):
    fn: str
    args: list
    t: str
    partition: list = field(default_factory=list)
    order: list = field(default_factory=list)      # OrderExpr
    frame: object = None
    ignore_nulls: bool = False
    ix: bool = False

    def render(self, d):
        args = ", ".join(a.render(d) for a in self.args) if self.args else ("*" if self.fn == "count" else "")
        over = []
        if self.partition:
            over.append("PARTITION BY " + ", ".join(p.render(d) for p in self.partition))
        if self.order:
            over.append("ORDER BY " + ", ".join(o.render(d) for o in self.order))
        if self.frame is not None:
            over.append(self.frame.render(d))
        if self.ignore_nulls and d == "duck":
            return f"{self.fn}({args} IGNORE NULLS) OVER ({' '.join(over)})"
        ign = " IGNORE NULLS" if self.ignore_nulls else ""
        return f"{self.fn}({args}){ign} OVER ({' '.join(over)})"


@dataclass
class Sub(Node):
    """A scalar subquery."""
    q: Node
    t: str
    ix: bool = False

    def render(self, d):
        return f"({self.q.render(d)})"


@dataclass
class Exists(Node):
    q: Node
    neg: bool = False
    t: str = "bool"
    ix: bool = False

    def render(self, d):
        return f"({'NOT ' if self.neg else ''}EXISTS ({self.q.render(d)}))"


@dataclass
class InSub(Node):
    e: Node
    q: Node
    neg: bool = False
    t: str = "bool"
    ix: bool = False

    def render(self, d):
        return f"({self.e.render(d)} {'NOT IN' if self.neg else 'IN'} ({self.q.render(d)}))"


# ---------------------------------------------------------------- queries

@dataclass
class Item(Node):
    e: Node
    alias: str

    def render(self, d):
        return f"{self.e.render(d)} AS {self.alias}"


@dataclass
class TableSrc(Node):
    name: str
    alias: str

    def render(self, d):
        return f"{self.name} {self.alias}"


@dataclass
class SubSrc(Node):
    q: Node
    alias: str

    def render(self, d):
        return f"({self.q.render(d)}) {self.alias}"


@dataclass
class Join(Node):
    kind: str    # INNER, LEFT, SEMI, ANTI
    src: Node
    on: list

    def render(self, d):
        kw = {"INNER": "JOIN", "LEFT": "LEFT JOIN",
              "SEMI": "LEFT SEMI JOIN" if d == "df" else "SEMI JOIN",
              "ANTI": "LEFT ANTI JOIN" if d == "df" else "ANTI JOIN"}[self.kind]
        on = " AND ".join(c.render(d) for c in self.on) or "TRUE"
        return f"{kw} {self.src.render(d)} ON {on}"


@dataclass
class GroupBy(Node):
    mode: str            # plain, rollup, cube, sets
    keys: list
    sets: list = field(default_factory=list)   # for `sets`: lists of key indexes

    def render(self, d):
        ks = [k.render(d) for k in self.keys]
        if self.mode == "plain":
            return ", ".join(ks)
        if self.mode in ("rollup", "cube"):
            return f"{self.mode.upper()} ({', '.join(ks)})"
        sets = ", ".join("(" + ", ".join(ks[i] for i in s if i < len(ks)) + ")" for s in self.sets)
        return f"GROUPING SETS ({sets})"


@dataclass
class OrderKey(Node):
    """ORDER BY of a query, by the alias of one of its output columns."""
    alias: str
    desc: bool = False
    nulls_first: object = None

    def render(self, d):
        return OrderExpr(Col("", self.alias, "str"), self.desc, self.nulls_first).render(d)


@dataclass
class Select(Node):
    items: list
    src: object                 # TableSrc/SubSrc or None
    joins: list = field(default_factory=list)
    where: list = field(default_factory=list)
    group: object = None
    having: list = field(default_factory=list)
    order: list = field(default_factory=list)  # OrderKey
    limit: object = None
    distinct: bool = False

    def out(self):
        return self.items

    def render(self, d):
        s = "SELECT " + ("DISTINCT " if self.distinct else "") + ", ".join(i.render(d) for i in self.items)
        if self.src is not None:
            s += " FROM " + self.src.render(d)
        for j in self.joins:
            s += " " + j.render(d)
        if self.where:
            s += " WHERE " + " AND ".join(w.render(d) for w in self.where)
        if self.group is not None and self.group.keys:
            s += " GROUP BY " + self.group.render(d)
        if self.having:
            s += " HAVING " + " AND ".join(h.render(d) for h in self.having)
        s += render_order_limit(self, d)
        return s


def render_order_limit(q, d):
    aliases = {i.alias for i in q.out()}
    keys = [k for k in q.order if k.alias in aliases]
    s = ""
    if keys:
        s += " ORDER BY " + ", ".join(k.render(d) for k in keys)
    if q.limit is not None:
        s += f" LIMIT {q.limit}"
    return s


@dataclass
class SetOp(Node):
    op: str        # UNION, UNION ALL, INTERSECT, EXCEPT, INTERSECT ALL, EXCEPT ALL
    left: Node
    right: Node
    order: list = field(default_factory=list)
    limit: object = None

    def out(self):
        return self.left.out()

    def render(self, d):
        def side(q):
            text = q.render(d)
            return f"({text})" if isinstance(q, SetOp) or q.order or q.limit is not None else text
        return f"{side(self.left)} {self.op} {side(self.right)}" + render_order_limit(self, d)


@dataclass
class Cte(Node):
    name: str
    q: Node


@dataclass
class With(Node):
    ctes: list
    body: Node

    def out(self):
        return self.body.out()

    @property
    def order(self):
        return self.body.order

    @property
    def limit(self):
        return self.body.limit

    def render(self, d):
        ctes = ", ".join(f"{c.name} AS ({c.q.render(d)})" for c in self.ctes)
        return f"WITH {ctes} {self.body.render(d)}"


def walk(node):
    """Every node below `node` (itself included), depth first."""
    yield node
    if isinstance(node, Node):
        for f in fields(node):
            v = getattr(node, f.name)
            if isinstance(v, Node):
                yield from walk(v)
            elif isinstance(v, list):
                for x in v:
                    if isinstance(x, Node):
                        yield from walk(x)
