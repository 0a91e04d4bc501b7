#!/usr/bin/env python3
"""Checks the Dockerfile and .dockerignore without a Docker engine (scripts/check-image runs it).

The Dockerfile is parsed by dockerfile-parse (Docker's instruction syntax); what enters the build
context is decided by the Docker SDK's own .dockerignore matching (docker.utils.build). Checked:

  * two stages, both linux/amd64; the build profile is the build argument PROFILE, `release` by
    default (no LTO: Cargo.toml's release profile has none), `dist` (fat LTO) only when asked;
  * the dependency layer: Cargo.toml, Cargo.lock and every workspace member's manifest are
    copied and the dependencies built (with BuildKit cache mounts for the crates.io cache) before
    src/ and crates/ are copied, so a change to skiff's code does not rebuild its dependencies;
  * the runtime stage runs as the non-root user skiff (uid 10001), listens on 0.0.0.0:8080, logs
    JSON, and runs `serve` (which needs a catalog);
  * no build argument or environment variable names a secret;
  * .dockerignore lets in exactly Cargo.toml, Cargo.lock, src/ and crates/ (never worker/node_modules,
    target/, lakes, .venv or .git), checked on a tree that has all of those, and on this clone.

Prints the runtime stage's environment as KEY=VALUE lines (for check-image to run the binary
with), and exits 1 naming every check that failed.
"""
import json
import os
import re
import shlex
import sys
import tempfile
import tomllib

from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def main():
    parser = DockerfileParser(path=os.path.join(ROOT, "Dockerfile"))
    instructions = [i for i in parser.structure if i["instruction"] != "COMMENT"]
    froms = [n for n, i in enumerate(instructions) if i["instruction"] == "FROM"]
    check(len(froms) == 2, f"two stages (build, runtime), found {len(froms)}")
    for n in froms:
        check("--platform=linux/amd64" in instructions[n]["value"], f"stage {instructions[n]['value']!r} is linux/amd64")
    build = instructions[froms[0] : froms[1]] if len(froms) == 2 else []
    runtime = instructions[froms[1] :] if len(froms) == 2 else []
    before = instructions[: froms[0]] if froms else []

    # The profile: a build argument, release unless asked.
    check(any(i["instruction"] == "ARG" and i["value"].strip() == "PROFILE=release" for i in before), "ARG PROFILE=release before the first FROM")
    check(any(i["instruction"] == "ARG" and i["value"].strip() == "PROFILE" for i in build), "the build stage takes ARG PROFILE")
    cargo = tomllib.load(open(os.path.join(ROOT, "Cargo.toml"), "rb"))
    profiles = cargo.get("profile", {})
    check(profiles.get("release", {}).get("lto") in (None, False, "off"), "the release profile (the default build) has no LTO")
    check(profiles.get("dist", {}).get("lto") == "fat", "the dist profile (PROFILE=dist) has fat LTO")
    check(not any("--profile dist" in i["value"] for i in build), "no build step forces the dist profile")

    # The dependency layer comes before the sources.
    kinds = [(i["instruction"], i["value"]) for i in build]
    manifests = next((n for n, (k, v) in enumerate(kinds) if k == "COPY" and v.split()[:2] == ["Cargo.toml", "Cargo.lock"]), None)
    sources = next((n for n, (k, v) in enumerate(kinds) if k == "COPY" and v.split()[0] == "src"), None)
    builds = [n for n, (k, v) in enumerate(kinds) if k == "RUN" and "cargo build" in v]
    check(manifests is not None and sources is not None, "the build stage copies Cargo.toml + Cargo.lock, and src, separately")
    if manifests is not None and sources is not None:
        check(any(manifests < n < sources for n in builds), "dependencies are built between copying the manifests and copying src/")
        check(any(n > sources for n in builds), "skiff is built after src/ is copied")
        check(not any(k == "COPY" and v.split()[0] in (".", "./") for k, v in kinds), "the build stage never copies the whole context")
    for n in builds:
        check("--mount=type=cache,target=/usr/local/cargo/registry" in kinds[n][1], f"build step {n} caches the crates.io registry (BuildKit cache mount)")
        check("--locked" in kinds[n][1], f"build step {n} builds --locked")
    if sources is not None:
        after = [v for n, (k, v) in enumerate(kinds) if k == "RUN" and n > sources]
        check(any("touch src/main.rs" in v for v in after), "the sources are touched before the final build (COPY keeps old mtimes)")
    # The workspace members: their manifests in the dependency layer, their sources after it.
    members = cargo.get("workspace", {}).get("members", [])
    crates = next((n for n, (k, v) in enumerate(kinds) if k == "COPY" and v.split()[0].rstrip("/") == "crates"), None)
    check(not members or crates is not None, "the build stage copies crates/ (the workspace members)")
    for m in members:
        copied = next((n for n, (k, v) in enumerate(kinds) if k == "COPY" and v.split()[0] == f"{m}/Cargo.toml"), None)
        check(copied is not None and manifests is not None and copied > manifests and all(copied < n for n in builds[:1]),
              f"{m}/Cargo.toml is copied before the dependency build")
        if crates is not None:
            after = [v for n, (k, v) in enumerate(kinds) if k == "RUN" and n > crates]
            check(any("cargo build" in v for v in after), f"{m} is built after crates/ is copied")
            check(any(f"{m.split('/', 1)[0]}/*/src/lib.rs" in v or f"{m}/src/lib.rs" in v for v in after if "touch" in v),
                  f"{m}'s sources are touched before the final build")

    # The runtime stage.
    rt = [(i["instruction"], i["value"]) for i in runtime]
    check(("USER", "skiff") in rt, "the runtime stage runs as USER skiff")
    check(any(k == "RUN" and "useradd" in v and "--uid 10001" in v for k, v in rt), "user skiff is uid 10001")
    envs = {}
    for k, v in rt:
        if k == "ENV":
            for part in shlex.split(v):
                key, _, value = part.partition("=")
                envs[key] = value
    check(envs.get("SKIFF_HTTP_ADDR") == "0.0.0.0:8080", "SKIFF_HTTP_ADDR=0.0.0.0:8080")
    check(envs.get("SKIFF_LOG_FORMAT") == "json", "SKIFF_LOG_FORMAT=json (JSON logs in the container)")
    check(("ENTRYPOINT", '["/usr/local/bin/skiff"]') in rt, 'ENTRYPOINT ["/usr/local/bin/skiff"]')
    check(("CMD", '["serve"]') in rt, 'CMD ["serve"]')
    check(("EXPOSE", "8080") in rt, "EXPOSE 8080")
    check(any(k == "COPY" and v.startswith("--from=build") for k, v in rt), "the binary comes from the build stage")
    secretish = re.compile(r"TOKEN|SECRET|PASSWORD|ACCESS_KEY", re.I)
    for i in instructions:
        if i["instruction"] in ("ARG", "ENV"):
            for part in shlex.split(i["value"]):
                name = part.partition("=")[0]
                check(not secretish.search(name), f"{i['instruction']} {name} names no secret")

    check_dockerignore(parser, build)

    for key, value in envs.items():
        print(f"{key}={value}")
    if failures:
        for f in failures:
            print(f"check_dockerfile: FAIL {f}", file=sys.stderr)
        sys.exit(1)


def context(root):
    patterns = []
    path = os.path.join(root, ".dockerignore")
    if os.path.exists(path):
        patterns = [l.strip() for l in open(path) if l.strip() and not l.lstrip().startswith("#")]
    return set(exclude_paths(root, patterns, dockerfile="Dockerfile"))


def check_dockerignore(parser, build):
    ignore = open(os.path.join(ROOT, ".dockerignore")).read()
    # A tree with everything a working copy holds.
    with tempfile.TemporaryDirectory() as d:
        files = {
            "Cargo.toml": "", "Cargo.lock": "", "Dockerfile": "", "README.md": "",
            "src/main.rs": "", "src/http/mod.rs": "", "crates/lake/Cargo.toml": "", "crates/lake/src/lib.rs": "",
            "worker/node_modules/wrangler/package.json": "{}", "worker/src/index.ts": "",
            "target/release/skiff": "", "lake/catalog.db": "", "lakes/30m/warehouse/x.parquet": "",
            ".venv/bin/python": "", ".git/HEAD": "", "tests/http_api.rs": "", "docs/performance.md": "",
        }
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)) or d, exist_ok=True)
            open(os.path.join(d, rel), "w").write(text)
        open(os.path.join(d, ".dockerignore"), "w").write(ignore)
        got = {p for p in context(d) if os.path.isfile(os.path.join(d, p))}
        want = {"Cargo.toml", "Cargo.lock", "src/main.rs", "src/http/mod.rs", "crates/lake/Cargo.toml", "crates/lake/src/lib.rs"}
        # Docker always sends the Dockerfile and .dockerignore themselves.
        got -= {"Dockerfile", ".dockerignore"}
        check(got == want, f".dockerignore lets in exactly Cargo.toml, Cargo.lock, src/ and crates/ (got {sorted(got)})")
    # This clone: every COPY source is in the context, and nothing big is.
    got = {p for p in context(ROOT) if os.path.isfile(os.path.join(ROOT, p))}
    for i in build:
        if i["instruction"] == "COPY" and not i["value"].startswith("--from"):
            for src in shlex.split(i["value"])[:-1]:
                src = src.rstrip("/")
                present = src in got or any(p.startswith(src + "/") for p in got)
                check(present, f"COPY source {src} is in the build context")
    size = sum(os.path.getsize(os.path.join(ROOT, p)) for p in got)
    check(size < 20 << 20, f"the build context is small ({size} bytes)")
    check(not any(p.startswith(("worker/", "target/", "lake", ".venv/", ".git/")) for p in got), "no node_modules, target, lake, .venv or .git in this clone's context")


if __name__ == "__main__":
    main()
