# skiff for Cloudflare Containers (linux/amd64) or any container runtime.
#
# Build stage: the dist binary (release with LTO) from the lock file. Runtime stage: Debian
# slim with CA certificates (Basin Catalog and R2 are HTTPS) and a non-root user. Expected
# image size: about 175 MB (bookworm-slim ~75 MB + ca-certificates ~1 MB + one statically
# linked-in Rust binary of ~100 MB with DataFusion, Arrow and the Iceberg crates, symbols
# stripped; measured 2026-12-02, the release profile's is 147 MB).
# All configuration comes from the environment (see README); no build argument holds a secret.

FROM --platform=linux/amd64 rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The dist profile: release with fat LTO (Cargo.toml); its link needs ~7 GB of memory.
RUN cargo build --profile dist --locked --bin skiff \
 && strip target/dist/skiff

FROM --platform=linux/amd64 debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /var/lib/skiff skiff
COPY --from=build /src/target/dist/skiff /usr/local/bin/skiff
USER skiff
WORKDIR /var/lib/skiff
# Containers receive only HTTP through their Durable Object: listen on all interfaces.
ENV SKIFF_HTTP_ADDR=0.0.0.0:8080
EXPOSE 8080
# skiff stops taking connections on SIGTERM and finishes running queries before exiting 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/skiff"]
CMD ["serve"]
