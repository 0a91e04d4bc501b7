# syntax=docker/dockerfile:1.7
# skiff for Cloudflare Containers (linux/amd64) or any container runtime.
#
#   docker build -t skiff .                          # release profile (the default)
#   docker build --build-arg PROFILE=dist -t skiff . # release with fat LTO: ~8% faster queries,
#                                                    # but a ~20-minute, ~7 GB link after every change
#
# Build stage: dependencies first, built from Cargo.toml and Cargo.lock alone, so that layer is
# reused until the manifests change (a change to skiff's own code rebuilds skiff only); the
# crates.io download cache is a BuildKit cache mount. Runtime stage: Debian slim with CA
# certificates (Basin Catalog and R2 are HTTPS) and a non-root user. Expected image size: about
# 175 MB (bookworm-slim ~75 MB + ca-certificates ~1 MB + the stripped binary, ~100-150 MB).
# All configuration comes from the environment (see README); no build argument holds a secret.

# release | dist (release with fat LTO, Cargo.toml's [profile.dist]).
ARG PROFILE=release

FROM --platform=linux/amd64 rust:1.95-bookworm AS build
ARG PROFILE
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates/lake/Cargo.toml crates/lake/
COPY crates/engine/Cargo.toml crates/engine/
COPY crates/metrics/Cargo.toml crates/metrics/
# The dependency layer: placeholder sources (main.rs, each crate's lib.rs), so only the
# dependencies are real.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    case "$PROFILE" in release|dist) ;; *) echo "PROFILE must be release or dist, not $PROFILE" >&2; exit 1;; esac \
 && mkdir src && echo 'fn main() {}' > src/main.rs \
 && for c in lake engine metrics; do mkdir "crates/$c/src" && touch "crates/$c/src/lib.rs"; done \
 && cargo build --profile "$PROFILE" --locked --bin skiff \
 && rm -rf src crates/*/src "target/$PROFILE/skiff" "target/$PROFILE/deps/skiff-"* "target/$PROFILE/deps/"*skiff_*
COPY src ./src
COPY crates ./crates
# COPY keeps the sources' old modification times: touch, so cargo sees them as newer than the placeholders.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    touch src/main.rs crates/*/src/lib.rs \
 && cargo build --profile "$PROFILE" --locked --bin skiff \
 && strip "target/$PROFILE/skiff" \
 && cp "target/$PROFILE/skiff" /skiff

FROM --platform=linux/amd64 debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /var/lib/skiff skiff
COPY --from=build /skiff /usr/local/bin/skiff
USER skiff
WORKDIR /var/lib/skiff
# Containers receive only HTTP through their Durable Object: listen on all interfaces. Logs are
# JSON lines, as log services (Workers Logs) read them.
ENV SKIFF_HTTP_ADDR=0.0.0.0:8080 \
    SKIFF_LOG_FORMAT=json
EXPOSE 8080
# skiff stops taking connections on SIGTERM and finishes running queries before exiting 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/skiff"]
# A catalog must be configured (SKIFF_CATALOG_URI): `serve` never falls back to a demo lake.
CMD ["serve"]
