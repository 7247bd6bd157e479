# syntax=docker/dockerfile:1
# fanout's container image: built with the project's pinned toolchain (rust-toolchain.toml, which
# rustup in the builder installs), run as an unprivileged user on a slim Debian.
#
#   docker build -t fanout .
#   docker run --rm -p 8080:8080 -p 9901:9901 \
#     -v "$PWD/fanout.yaml:/etc/fanout/fanout.yaml:ro" fanout
#
# The config must listen on 0.0.0.0 (`listen: 0.0.0.0:8080`, `admin: {listen: 0.0.0.0:9901}`);
# the Helm chart (deploy/helm/fanout) sets both. See docs/operations.md.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The caches survive between builds (BuildKit); the binary is copied out of the target cache.
# Only the gateway (`-p fanout`): the load lab is the separate `fanout-lab` binary, not in the
# image (`fanout lab` in the image says how to build it; docs/ARCHITECTURE.md).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p fanout --locked \
    && install -D -m 0755 target/release/fanout /out/fanout

FROM debian:bookworm-slim AS runtime
# No package is installed: fanout links only glibc (TLS roots are built in), and `sleep` (the
# preStop hook on Kubernetes before 1.30) comes with coreutils.
RUN groupadd --system --gid 10001 fanout \
    && useradd --system --uid 10001 --gid fanout --no-create-home --shell /usr/sbin/nologin fanout \
    && mkdir -p /etc/fanout
COPY --from=build /out/fanout /usr/local/bin/fanout
USER 10001:10001
# 8080: client traffic (`listen`); 9901: admin (/metrics, /healthz, /readyz, /__fanout/status).
EXPOSE 8080 9901
# Arguments after the image name are appended, e.g. `--workers 2 --log-format json`.
ENTRYPOINT ["fanout", "serve", "--config", "/etc/fanout/fanout.yaml"]
