// How a Basin SQL client (Dataflare's Worker) writes SQL over a versioned table: Basin SQL reads
// `glass.events` as one physical table, so the client replaces it with a UNION ALL of every
// version, by column name, padding a column a version lacks with a typed NULL. skiff's Basin
// route reads names as Basin does, so this SQL counts every row once there.

/** A version's columns, as Basin's `DESCRIBE glass.<table>` lists them: name and Arrow type. */
export type Columns = { name: string; type: string }[];

const SQL_TYPES: [RegExp, string][] = [
  [/Utf8/, "VARCHAR"],
  [/^Timestamp/, "TIMESTAMP"],
  [/^Float64$/, "DOUBLE"],
  [/^Float32$/, "REAL"],
  [/^Int64$/, "BIGINT"],
  [/^Int32$/, "INT"],
  [/^Boolean$/, "BOOLEAN"],
];

function sqlType(arrow: string): string {
  const hit = SQL_TYPES.find(([re]) => re.test(arrow));
  if (!hit) throw new Error(`no SQL type name for ${arrow}`);
  return hit[1];
}

const KEYWORDS = new Set(["WHERE", "GROUP", "ORDER", "LIMIT", "LEFT", "RIGHT", "INNER", "JOIN", "ON", "UNION", "HAVING", "QUALIFY", "CROSS", "FULL"]);

/** `sql` with every `glass.<table>` (not `glass.<table>_v2`) replaced by the union of `versions`. */
export function expandVersions(sql: string, table: string, versions: [string, Columns][]): string {
  const all: Columns = [];
  for (const [, cols] of versions) for (const c of cols) if (!all.some((a) => a.name === c.name)) all.push(c);
  const branches = versions.map(([name, cols]) => {
    const list = all.map((c) => (cols.some((x) => x.name === c.name) ? `"${c.name}"` : `CAST(NULL AS ${sqlType(c.type)}) AS "${c.name}"`));
    return `SELECT ${list.join(", ")} FROM glass.${name}`;
  });
  const union = `(${branches.join(" UNION ALL ")})`;
  return sql.replace(new RegExp(`glass\\.${table}(?![A-Za-z0-9_])(\\s+([A-Za-z_][A-Za-z0-9_]*))?`, "g"), (_m, _ws, next?: string) => {
    if (next && !KEYWORDS.has(next.toUpperCase())) return `${union} ${next}`;
    return `${union} AS ${table}${next ? ` ${next}` : ""}`;
  });
}
