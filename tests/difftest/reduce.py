"""Greedy structural reduction: try smaller versions of a query (a select item, predicate,
join, clause, window, CTE consumer dropped; an expression replaced by one of its parts; a
set operation replaced by one side; a flag such as DISTINCT or IGNORE NULLS turned off) and
keep the first that still shows the same mismatch, until none does or the budget is spent."""
import copy
import time
from dataclasses import fields

from .sqlast import (Agg, Between, Bin, Call, Case, Cast, Exists, GroupBy, In, InSub, Join, Like, Lit, Node,
                     Select, SetOp, Sub, SubSrc, Un, When, Win, With)

# list fields an element may be dropped from, with the fewest elements each must keep
REMOVABLE = {
    (Select, "items"): 1, (Select, "joins"): 0, (Select, "where"): 0, (Select, "having"): 0, (Select, "order"): 0,
    (GroupBy, "keys"): 1, (GroupBy, "sets"): 1, (Agg, "order"): 0, (Win, "partition"): 0, (Win, "order"): 0,
    (In, "items"): 1, (Case, "whens"): 1, (Join, "on"): 1, (Call, "args"): None,
}
# optional fields that may become None, and flags that may become False
OPTIONAL = {(Select, "limit"), (Select, "group"), (Agg, "filt"), (Win, "frame"), (Case, "els"), (SetOp, "limit")}
FLAGS = {(Select, "distinct"), (Agg, "distinct"), (Win, "ignore_nulls"), (In, "neg"), (Exists, "neg"),
         (InSub, "neg"), (Like, "neg"), (Like, "ci"), (Between, "neg")}


def sites(node, path=()):
    """(path, node) for every node below `node`; a path is ((field, index or None), ...)."""
    for f in fields(node):
        v = getattr(node, f.name)
        if isinstance(v, Node):
            p = path + ((f.name, None),)
            yield p, v
            yield from sites(v, p)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                if isinstance(x, Node):
                    p = path + ((f.name, i),)
                    yield p, x
                    yield from sites(x, p)


def get(root, path):
    node = root
    for name, i in path:
        node = getattr(node, name) if i is None else getattr(node, name)[i]
    return node


def parent_of(root, path):
    return get(root, path[:-1]), path[-1]


def with_change(root, path, change):
    """A copy of root where change(parent, field, index) was applied at path."""
    new = copy.deepcopy(root)
    parent, (name, i) = parent_of(new, path)
    change(parent, name, i)
    return new


def candidates(root):
    """Smaller versions of root, roughly the biggest cuts first."""
    out = []
    all_sites = list(sites(root))
    # replace the whole query by a part of it
    for path, node in [((), root)] + all_sites:
        if isinstance(node, SetOp):
            for side in (node.left, node.right):
                out.append((0, _replace(root, path, side)))
        if isinstance(node, With) and len(node.ctes) == 1 and path == ():
            pass
    for path, node in all_sites:
        parent, (name, i) = parent_of(root, path)
        key = (type(parent), name)
        if any(f in ("order", "partition_order") for f, _ in path[:-1]) or (name == "order" and not _may_reorder(root, path)):
            # an order a window, an ordered aggregate or a LIMIT depends on stays whole: without
            # it the answer would depend on the engine's choices
            continue
        if i is not None and key in REMOVABLE and REMOVABLE[key] is not None:
            if key == (Select, "items") and parent.limit is not None and \
                    node.alias in {k.alias for k in parent.order}:
                continue  # the ORDER BY a LIMIT depends on goes with it: never a LIMIT without it
            if len(getattr(parent, name)) > REMOVABLE[key]:
                out.append((1, with_change(root, path, lambda p, n, j: getattr(p, n).pop(j))))
        if i is None and key in OPTIONAL:
            out.append((2, with_change(root, path, lambda p, n, j: setattr(p, n, None))))
        # an expression replaced by a part of it of the same type
        t = getattr(node, "t", None)
        if t is not None and not isinstance(node, (Lit,)):
            for child in _expr_children(node):
                if getattr(child, "t", None) == t and not isinstance(parent, (GroupBy,)):
                    out.append((3, _replace(root, path, child)))
        # simpler variants of a node
        for variant in _simpler(node):
            out.append((4, _replace(root, path, variant)))
    for path, node in [((), root)] + all_sites:
        for f in fields(node):
            if (type(node), f.name) in FLAGS and getattr(node, f.name):
                new = copy.deepcopy(root)
                setattr(get(new, path), f.name, False)
                out.append((5, new))
    out.sort(key=lambda x: x[0])
    return [c for _, c in out]


def _may_reorder(root, path):
    """Whether the ORDER BY element at path may go: only a top-level one (the comparison then
    treats the rows as a multiset), never one under a LIMIT below the top, a window's or an
    aggregate's."""
    parent, _ = parent_of(root, path)
    if isinstance(parent, (Win, Agg)):
        return False
    top = root.body if isinstance(root, With) else root
    return parent is top and top.limit is None


def _replace(root, path, new_node):
    if path == ():
        return copy.deepcopy(new_node)
    return with_change(root, path, lambda p, n, j: (setattr(p, n, copy.deepcopy(new_node)) if j is None
                                                     else getattr(p, n).__setitem__(j, copy.deepcopy(new_node))))


def _expr_children(node):
    kids = []
    if isinstance(node, (Bin,)):
        kids = [node.l, node.r]
    elif isinstance(node, (Un, Cast, Like, Between, In, InSub)):
        kids = [node.e]
    elif isinstance(node, Call):
        kids = [a for a in node.args if isinstance(a, Node)]
    elif isinstance(node, Case):
        kids = [w.val for w in node.whens] + ([node.els] if node.els is not None else [])
    elif isinstance(node, When):
        kids = []
    return kids


def _simpler(node):
    out = []
    if isinstance(node, Join) and node.kind != "INNER":
        out.append(Join("INNER", node.src, node.on))
    if isinstance(node, GroupBy) and node.mode != "plain":
        out.append(GroupBy("plain", node.keys))
    if isinstance(node, Agg) and node.fn != "count" and node.t == "int":
        out.append(Agg("count", [], "int", filt=node.filt))
    if isinstance(node, Win) and node.fn not in ("row_number",) and node.t == "int":
        out.append(Win("row_number", [], "int", node.partition, node.order))
    if isinstance(node, Sub) and isinstance(node.q, Select) and node.q.where:
        q = copy.deepcopy(node.q)
        q.where = []
        out.append(Sub(q, node.t, node.ix))
    if isinstance(node, SubSrc) and isinstance(node.q, Select) and node.q.limit is not None:
        q = copy.deepcopy(node.q)
        q.limit = None
        out.append(SubSrc(q, node.alias))
    return out


def reduce(q, still_fails, budget_s=60.0, max_tries=400):
    """The smallest q found for which still_fails(q) holds, and the number of tries."""
    best, best_len = q, len(q.render("df"))
    tries = 0
    deadline = time.monotonic() + budget_s
    improved = True
    while improved and tries < max_tries and time.monotonic() < deadline:
        improved = False
        seen = set()
        for cand in candidates(best):
            text = cand.render("df")
            if len(text) >= best_len or text in seen:
                continue
            seen.add(text)
            tries += 1
            if still_fails(cand):
                best, best_len = cand, len(text)
                improved = True
                break
            if tries >= max_tries or time.monotonic() >= deadline:
                break
    return best, tries
