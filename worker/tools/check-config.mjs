// Validates ../wrangler.jsonc (or --config PATH) without Cloudflare or Docker.
//
//   node tools/check-config.mjs [--config PATH] [--template]
//
// Refuses the <ACCOUNT_ID>/<BUCKET> placeholders, so `npm run deploy` (which runs this first)
// never deploys a skiff without a catalog; --template accepts them, for the repository's own
// copy (scripts/test checks that copy with --template, and test/tools checks the refusal).
//
// `wrangler deploy --dry-run` bundles the Worker offline but then needs a Docker daemon to
// build the container image, so it cannot run here or in CI. Instead:
//  1. `wrangler types` runs wrangler's own config validation (container fields, bindings,
//     migrations, that the image path is a Dockerfile) and derives the Env it would deploy;
//  2. this script asserts the container / Durable Object / migration / vars wiring, and with a
//     worker pool (SKIFF_WORKER_POOL > 0) what the pool needs.
// wrangler runs in a temporary mirror of the repo root so it leaves no .wrangler/ behind.
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const workerDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const root = resolve(workerDir, "..");
const argv = process.argv.slice(2);
const at = argv.indexOf("--config");
const configPath = at >= 0 ? resolve(argv[at + 1]) : join(root, "wrangler.jsonc");
const template = argv.includes("--template");
const failures = [];
const check = (ok, what) => (ok ? console.log(`ok   ${what}`) : failures.push(what) && console.log(`FAIL ${what}`));

/** JSONC -> JSON: drops // and /* comments outside strings (URLs hold "//") and trailing commas. */
function stripJsonc(text) {
  let out = "";
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (j < text.length && text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j;
    } else if (c === "/" && text[i + 1] === "/") {
      while (i < text.length && text[i] !== "\n") i++;
      out += "\n";
    } else if (c === "/" && text[i + 1] === "*") {
      i = text.indexOf("*/", i + 2) + 1;
      if (i === 0) throw new Error("unterminated /* comment");
    } else {
      out += c;
    }
  }
  return out.replace(/,(\s*[}\]])/g, "$1");
}

const raw = readFileSync(configPath, "utf8");
const cfg = JSON.parse(stripJsonc(raw));

// 1. wrangler's own validation, in a mirror of the repo root.
const mirror = mkdtempSync(join(tmpdir(), "skiff-check-config-"));
try {
  writeFileSync(join(mirror, "wrangler.jsonc"), raw);
  symlinkSync(workerDir, join(mirror, "worker"));
  const dockerfile = join(root, "Dockerfile");
  if (existsSync(dockerfile)) {
    symlinkSync(dockerfile, join(mirror, "Dockerfile"));
  } else {
    console.log("note the repo has no Dockerfile yet: wrangler checks against a placeholder");
    writeFileSync(join(mirror, "Dockerfile"), "FROM scratch\n");
  }
  const typesFile = join(mirror, "env.d.ts");
  let types = "";
  try {
    execFileSync(
      join(workerDir, "node_modules", ".bin", "wrangler"),
      ["types", typesFile, "--config", join(mirror, "wrangler.jsonc"), "--include-runtime=false"],
      { cwd: mirror, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, WRANGLER_SEND_METRICS: "false" } },
    );
    types = readFileSync(typesFile, "utf8");
    check(true, "wrangler types accepts wrangler.jsonc");
  } catch (e) {
    check(false, `wrangler types accepts wrangler.jsonc:\n${e.stdout ?? ""}${e.stderr ?? e}`);
  }
  check(/SKIFF: DurableObjectNamespace<import\(".*worker\/src\/index"\)\.SkiffContainer>/.test(types), "wrangler derives SKIFF as the SkiffContainer namespace");
  check(/durableNamespaces: "SkiffContainer"/.test(types), "wrangler sees SkiffContainer as a Durable Object class");
  check(
    /SKIFF_WORKER: DurableObjectNamespace<import\(".*worker\/src\/index"\)\.SkiffWorkerContainer>/.test(types),
    "wrangler derives SKIFF_WORKER as the SkiffWorkerContainer namespace",
  );
  check(/durableNamespaces: [^\n]*"SkiffWorkerContainer"/.test(types), "wrangler sees SkiffWorkerContainer as a Durable Object class");
} finally {
  rmSync(mirror, { recursive: true, force: true });
}

// 2. The wiring skiff needs.
check(typeof cfg.name === "string" && cfg.name.length > 0, "name is set");
check(cfg.main === "worker/src/index.ts" && existsSync(join(root, cfg.main)), "main is worker/src/index.ts and exists");
check(/^\d{4}-\d{2}-\d{2}$/.test(cfg.compatibility_date ?? ""), "compatibility_date is a date");
const mainExports = /export\s*\{([^}]*)\}/.exec(readFileSync(join(root, cfg.main), "utf8"))?.[1].split(",").map((n) => n.trim()) ?? [];
for (const cls of ["SkiffContainer", "SkiffWorkerContainer"]) check(mainExports.includes(cls), `main exports ${cls}`);

const vars = cfg.vars ?? {};
const containers = cfg.containers ?? [];
check(
  containers.length === 2 && containers.some((c) => c.class_name === "SkiffContainer") && containers.some((c) => c.class_name === "SkiffWorkerContainer"),
  "two containers, classes SkiffContainer and SkiffWorkerContainer",
);
const INSTANCE_TYPES = ["lite", "basic", "standard-1", "standard-2", "standard-3", "standard-4"];
// SkiffWorkerContainer's pool size; NaN for anything but a count.
const workerPool = /^\s*\d*\s*$/.test(vars.SKIFF_WORKER_POOL ?? "") ? Number.parseInt(vars.SKIFF_WORKER_POOL || "0", 10) : Number.NaN;
for (const [cls, poolVar, pool] of [
  ["SkiffContainer", "SKIFF_INSTANCES", Number.parseInt(vars.SKIFF_INSTANCES ?? "1", 10)],
  ["SkiffWorkerContainer", "SKIFF_WORKER_POOL", workerPool],
]) {
  const c = containers.find((x) => x.class_name === cls) ?? {};
  check(c.image === "./Dockerfile", `${cls}'s image is ./Dockerfile`);
  check(INSTANCE_TYPES.includes(c.instance_type), `${cls}'s instance_type ${c.instance_type} is one of ${INSTANCE_TYPES.join(", ")}`);
  check(Number.isInteger(c.max_instances) && c.max_instances >= Math.max(pool, 1), `${cls}'s max_instances (${c.max_instances}) >= ${poolVar} (${pool})`);
}

const bindings = cfg.durable_objects?.bindings ?? [];
for (const [name, cls] of [["SKIFF", "SkiffContainer"], ["SKIFF_WORKER", "SkiffWorkerContainer"]]) {
  check(bindings.some((b) => b.name === name && b.class_name === cls && !b.script_name), `Durable Object binding ${name} -> ${cls}`);
}
const migrations = cfg.migrations ?? [];
// A deployed migration is never edited: the first stays as it was deployed.
check(
  JSON.stringify(migrations[0]) === JSON.stringify({ tag: "v1", new_sqlite_classes: ["SkiffContainer"] }),
  'the first migration is still { "tag": "v1", "new_sqlite_classes": ["SkiffContainer"] }',
);
check(new Set(migrations.map((m) => m.tag)).size === migrations.length, "migration tags are distinct");
for (const cls of ["SkiffContainer", "SkiffWorkerContainer"]) {
  check(migrations.some((m) => (m.new_sqlite_classes ?? []).includes(cls)), `a migration creates ${cls} as a SQLite class`);
  check(!migrations.some((m) => (m.new_classes ?? []).includes(cls)), `${cls} is not a key-value-backed class`);
}

for (const k of ["SKIFF_CATALOG_URI", "SKIFF_WAREHOUSE", "LAKE_VERSIONS", "SKIFF_INSTANCES"]) {
  check(typeof vars[k] === "string" && vars[k].length > 0, `vars.${k} is set`);
}
check(/^https?:\/\/[^/]+\/.+$/.test(vars.SKIFF_CATALOG_URI ?? ""), "SKIFF_CATALOG_URI is a REST catalog URI (Basin Catalog: https://catalog.cloudflarestorage.com/<ACCOUNT_ID>/<BUCKET>)");
for (const k of ["SKIFF_CATALOG_URI", "SKIFF_WAREHOUSE"]) {
  const placeholder = /<[A-Z_]+>/.exec(vars[k] ?? "");
  if (template) {
    if (placeholder) console.log(`note vars.${k} holds the placeholder ${placeholder[0]} (--template)`);
  } else {
    check(!placeholder, `vars.${k} holds no placeholder (replace ${placeholder?.[0]} with your account id / bucket)`);
  }
}
const required = cfg.secrets?.required ?? [];
for (const secret of ["API_TOKEN", "CF_API_TOKEN"]) check(required.includes(secret), `secrets.required lists ${secret}`);

// The worker pool.
check(Number.isInteger(workerPool), `SKIFF_WORKER_POOL (${vars.SKIFF_WORKER_POOL}) is a number of worker containers, "0" for none`);
if (workerPool > 0) {
  // Deployed Workers are https: the pool's token must not cross the internet in clear (ws://).
  check(
    /^https:\/\/[^/?#@\s]+\/?$/.test(vars.SKIFF_PUBLIC_URL ?? ""),
    `with SKIFF_WORKER_POOL ${workerPool}, SKIFF_PUBLIC_URL is this Worker's https origin (${JSON.stringify(vars.SKIFF_PUBLIC_URL ?? "")}; e.g. https://skiff.<subdomain>.workers.dev)`,
  );
  check(required.includes("SKIFF_WORKER_TOKEN"), `with SKIFF_WORKER_POOL ${workerPool}, secrets.required lists SKIFF_WORKER_TOKEN`);
}
// Set by the container classes (the list from SKIFF_WORKER_POOL and SKIFF_PUBLIC_URL, the
// listeners their own): a var of the name would be ignored, so it is refused rather than trusted.
for (const k of ["SKIFF_WORKERS", "SKIFF_WORKER_ADDR", "SKIFF_WORKER_TUNNEL_ADDR"]) {
  check(!(k in vars), `${k} is not a var (the container classes set it)`);
}
const hint = vars.SKIFF_LOCATION_HINT ?? "";
check(hint === "" || ["wnam", "enam", "sam", "weur", "eeur", "apac", "oc", "afr", "me"].includes(hint), `SKIFF_LOCATION_HINT (${hint}) is a location hint or empty`);
for (const secret of ["API_TOKEN", "CF_API_TOKEN", "SKIFF_CATALOG_TOKEN", "SKIFF_WORKER_TOKEN"]) {
  check(!(secret in vars), `${secret} is not a plain var (it is a secret)`);
  if (secret !== "SKIFF_CATALOG_TOKEN") check(raw.includes(`wrangler secret put ${secret}`), `comments say: wrangler secret put ${secret}`);
}

if (failures.length > 0) {
  console.log(`\ncheck-config: ${failures.length} problem(s)`);
  process.exit(1);
}
console.log("\ncheck-config: wrangler.jsonc is wired correctly");
