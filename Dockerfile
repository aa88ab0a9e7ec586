# The two images, built by scripts/image.sh (podman); the script prepares everything this file needs:
#
#   BASE     a Debian root of the suite the binary was built on (scripts/image.sh makes it with
#            debootstrap and imports it: no registry is needed)
#   context  a folder holding only the release binary `rbd-provisioner`, built against that
#            suite's librados/librbd (scripts/image.sh says which build and why)
#
#   podman build --build-arg BASE=... --target provisioner -t rbd-provisioner:latest CONTEXT
#   podman build --build-arg BASE=... --target node -t rbd-provisioner-node:latest CONTEXT
#
# `docker build` takes the same arguments (e.g. BASE=debian:bookworm-slim where a registry is at hand).
ARG BASE=debian:bookworm-slim

# The controller (provisioner, CSI controller, attach controller, gc, migrate): librados/librbd
# and the CA certificates (its API client loads the system's roots at start and fails without
# any); no rbd CLI, no keyring, non-root.
FROM ${BASE} AS provisioner
ARG DEBIAN_FRONTEND=noninteractive
ARG APT_OPTS=""
RUN apt-get $APT_OPTS update \
 && apt-get install -y --no-install-recommends librbd1 librados2 ca-certificates \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY rbd-provisioner /usr/bin/rbd-provisioner
USER 65532:65532
ENTRYPOINT ["/usr/bin/rbd-provisioner"]

# The CSI node plugin: the mappers (`rbd map` from ceph-common for krbd, rbd-nbd, rbd-fuse with
# fuse3 and losetup), LUKS2 (cryptsetup), the CA certificates (it reads its Node through the API
# for --topology-labels), the filesystems' mkfs/fsck/grow tools and mount; it runs
# privileged as root (it maps devices and mounts). Its own stage so the controller stays small.
FROM ${BASE} AS node
ARG DEBIAN_FRONTEND=noninteractive
ARG APT_OPTS=""
RUN apt-get $APT_OPTS update \
 && apt-get install -y --no-install-recommends librbd1 librados2 ca-certificates ceph-common \
      rbd-nbd rbd-fuse fuse3 cryptsetup-bin xfsprogs e2fsprogs util-linux mount kmod \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY rbd-provisioner /usr/bin/rbd-provisioner
ENTRYPOINT ["/usr/bin/rbd-provisioner", "csi"]
