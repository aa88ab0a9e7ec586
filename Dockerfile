# Multi-stage build of rbd-provisioner.
#   docker build --target provisioner -t rbd-provisioner:latest .       (controller: small, no ceph-common)
#   docker build --target node -t rbd-provisioner-node:latest .         (CSI node plugin: + mapping tools)
#
# Built on and shipping Debian sid's Ceph client (20.2 Tentacle), the only Debian suite with a client
# that reads the aes256k cephx keys Ceph 20.2 and 19.2.6+ make by default (trixie has 18.2, bookworm
# 16.2). `--build-arg DEBIAN_SUITE=bookworm` builds the Pacific-linked image instead (its users need
# aes keys on Tentacle: README, "Supported Ceph releases").
ARG DEBIAN_SUITE=sid

FROM debian:${DEBIAN_SUITE}-slim AS build
ARG RUST_VERSION=1.95.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends librbd-dev librados-dev libclang-dev pkg-config gcc \
      libc6-dev curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
  | sh -s -- -y --profile minimal --default-toolchain "$RUST_VERSION"
ENV PATH=/root/.cargo/bin:$PATH
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p rbd-provisioner \
 && cp target/release/rbd-provisioner /rbd-provisioner

# The controller: librbd/librados runtime libraries only; no rbd CLI, no keyring, non-root.
FROM debian:${DEBIAN_SUITE}-slim AS provisioner
RUN apt-get update \
 && apt-get install -y --no-install-recommends librbd1 librados2 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /rbd-provisioner /usr/bin/rbd-provisioner
USER 65532:65532
ENTRYPOINT ["/usr/bin/rbd-provisioner"]

# The CSI node plugin needs the mappers (rbd map, rbd-nbd, rbd-fuse) and filesystem tools, and
# runs privileged as root (it maps devices and mounts).
FROM provisioner AS node
USER 0:0
RUN apt-get update \
 && apt-get install -y --no-install-recommends ceph-common rbd-nbd rbd-fuse fuse3 \
      xfsprogs e2fsprogs util-linux mount kmod \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["/usr/bin/rbd-provisioner", "csi"]
