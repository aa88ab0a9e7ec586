# Multi-stage build of rbd-provisioner.
#   docker build --target provisioner -t rbd-provisioner:latest .       (controller: small, no ceph-common)
#   docker build --target node -t rbd-provisioner-node:latest .         (CSI node plugin: + mapping tools)

FROM rust:1-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends librbd-dev librados-dev libclang-dev clang pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p rbd-provisioner \
 && cp target/release/rbd-provisioner /rbd-provisioner

# The controller: librbd/librados runtime libraries only; no rbd CLI, no keyring, non-root.
FROM debian:bookworm-slim AS provisioner
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
