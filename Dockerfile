# syntax=docker/dockerfile:1
# kubesink's container images, from one multi-stage build (BuildKit):
#   docker build -t kubesink:0.1.0 .                                  # the bridge (last stage)
#   docker build --target kubesink-sim -t kubesink-sim:0.1.0 .        # the API simulator
# Stages: chef (toolchain + cargo-chef) -> planner (dependency recipe) -> builder (dependencies
# in their own cached layer, then the workspace) -> runtime (Debian slim, CA certificates,
# the shared libraries below, non-root) -> kubesink-sim, kubesink.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS chef
# librdkafka (rdkafka-sys) is built from source: C compiler, make, OpenSSL and zlib headers
# (the rust image has most; listed so a slimmer base still works). zstd is vendored.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential pkg-config libssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
RUN cargo install cargo-chef --version 0.1.78 --locked
WORKDIR /src

# The recipe lists manifests and lockfile only: it changes when dependencies change, not
# when the code does.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
# The production build leaves `kubesink demo` (cargo feature `sim`) out.
ARG KUBESINK_FEATURES=stdout,nats,kafka,http,otlp
COPY --from=planner /src/recipe.json recipe.json
# Dependencies only: this layer is reused until Cargo.toml or Cargo.lock change.
RUN cargo chef cook --release --locked --recipe-path recipe.json \
      -p kubesink --no-default-features --features "${KUBESINK_FEATURES}" \
 && cargo chef cook --release --locked --recipe-path recipe.json -p kubesink-sim
COPY . .
RUN cargo build --release --locked -p kubesink --no-default-features --features "${KUBESINK_FEATURES}" \
 && cargo build --release --locked -p kubesink-sim \
 && cp target/release/kubesink target/release/kubesink-sim /usr/local/bin/

# What the binaries link dynamically (ldd): glibc, libgcc_s, zlib (in the slim image) and
# OpenSSL 3 (librdkafka's TLS); rustls (kube, NATS) uses the CA certificates.
FROM debian:${DEBIAN_RELEASE}-slim AS runtime
# The user's passwd/group entry, as scripts/image.sh writes it (deploy/image.env).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
# A numeric non-root user, so Kubernetes can verify runAsNonRoot (deploy/base uses 65532).
# The runtime facts here (user, workdir, binary path, port, entrypoint, labels, features,
# Debian release) are deploy/image.env's, which scripts/image.sh builds the image from without
# Docker; scripts/check-deploy.sh fails when they differ.
USER 65532:65532
WORKDIR /

FROM runtime AS kubesink-sim
COPY --from=builder /usr/local/bin/kubesink-sim /usr/local/bin/kubesink-sim
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kubesink-sim"]
CMD ["--listen", "0.0.0.0:8080"]

# The default target: the bridge. /metrics, /healthz, /readyz on 9090 ([server] listen).
FROM runtime AS kubesink
# The per-build labels (the release workflow passes them; scripts/image.sh sets the same from
# Cargo.toml and the commit).
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
LABEL org.opencontainers.image.title="kubesink" \
      org.opencontainers.image.description="Streams Kubernetes topology changes into message brokers" \
      org.opencontainers.image.source="https://github.com/kubesink/kubesink" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
COPY --from=builder /usr/local/bin/kubesink /usr/local/bin/kubesink
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/kubesink"]
CMD ["run"]
