"""The lake's tables and columns, read from its SQLite catalog and metadata files (no
PyIceberg needed), in the form the generator uses: skiff's view of it, where `glass.events`
is the union of `glass.events` and every `glass.events_vN`."""
import json
import os
import re
import sqlite3
from dataclasses import dataclass, field

TYPES = {"string": "str", "long": "int", "int": "int", "double": "float", "float": "float",
         "timestamp": "ts", "boolean": "bool", "date": "date"}

# Roles of the columns gen_lake.py and hurt_lake.py write. Unknown columns get one by type.
LOWCARD = {"project_id", "event", "browser", "os", "device_type", "country", "utm_source",
           "utm_medium", "utm_campaign", "referrer"}
HIGHCARD = {"event_id", "device_id", "person_id", "user_id", "session_id", "url"}
# JSON string columns and the keys their documents hold, with the type each key usually has.
JSON_KEYS = {
    "props": {"amount": "float", "price": "float", "items": "int", "results": "int", "q": "str",
              "currency": "str", "plan": "str", "tag": "str", "text": "str", "sku": "str", "$title": "str"},
    "person_props": {"plan": "str"},
}


@dataclass
class Column:
    name: str
    t: str              # str, int, float, ts, bool, date
    nullable: bool
    role: str           # lowcard, highcard, json, ts, num, bool
    versions: int = 1   # in how many of the union's versions it exists


@dataclass
class Table:
    name: str                      # as skiff names it: glass.events, glass.events_v2
    kind: str                      # events, identities
    columns: list = field(default_factory=list)
    unique: list = field(default_factory=list)  # columns that identify a row
    physical: list = field(default_factory=list)  # [(metadata_location, has_snapshot, columns)]

    def col(self, name):
        return next((c for c in self.columns if c.name == name), None)


def role_of(name, t):
    if name in JSON_KEYS:
        return "json"
    if name in LOWCARD:
        return "lowcard"
    if t == "str":
        return "highcard"
    if t in ("ts", "date"):
        return "ts"
    if t in ("int", "float"):
        return "num"
    return t


def _schema(metadata):
    sid = metadata.get("current-schema-id", 0)
    schema = next(s for s in metadata["schemas"] if s.get("schema-id", 0) == sid)
    cols = []
    for f in schema["fields"]:
        t = TYPES.get(f["type"]) if isinstance(f["type"], str) else None
        if t:
            cols.append((f["name"], t, not f.get("required", False)))
    return cols


def load(lake_dir):
    """{skiff table name: Table} for the events-like and identities-like tables of a lake."""
    db = sqlite3.connect(os.path.join(lake_dir, "catalog.db"))
    rows = db.execute("SELECT table_namespace, table_name, metadata_location FROM iceberg_tables").fetchall()
    physical = {}
    for ns, name, loc in rows:
        path = loc[len("file://"):] if loc.startswith("file://") else loc
        with open(path) as f:
            meta = json.load(f)
        snap = meta.get("current-snapshot-id")
        physical[(ns, name)] = (loc, snap not in (None, -1), _schema(meta))
    groups = {}
    for (ns, name), p in physical.items():
        base = re.sub(r"_v\d+$", "", name)
        groups.setdefault((ns, base), []).append((name, p))
    tables = {}
    for (ns, base), members in groups.items():
        members.sort(key=lambda m: m[0])
        # the union: every version's columns by name
        merged, count = {}, {}
        for _, (_, _, cols) in members:
            for name, t, nullable in cols:
                count[name] = count.get(name, 0) + 1
                if name not in merged:
                    merged[name] = (t, nullable)
                elif merged[name][0] != t:
                    merged[name] = ("float" if {t, merged[name][0]} == {"int", "float"} else merged[name][0],
                                    True)
        union_cols = [Column(n, t, nullable or count[n] < len(members), role_of(n, t), count[n])
                      for n, (t, nullable) in merged.items()]
        add(tables, f"{ns}.{base}", union_cols, [p for _, p in members])
        if len(members) > 1:
            for name, p in members:
                if name != base:
                    cols = [Column(n, t, nl, role_of(n, t)) for n, t, nl in p[2]]
                    add(tables, f"{ns}.{name}", cols, [p])
    return tables


def add(tables, name, cols, physical):
    names = {c.name for c in cols}
    if {"event_id", "timestamp", "event", "device_id"} <= names:
        tables[name] = Table(name, "events", cols, ["event_id"], physical)
    elif {"device_id", "person_id", "timestamp"} <= names and "event" not in names:
        tables[name] = Table(name, "identities", cols, ["device_id", "person_id"], physical)
