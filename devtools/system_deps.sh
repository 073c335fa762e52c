#!/bin/sh
# System packages the tests and benchmarks need (Debian 12), installed when missing:
# `make test` runs this first (so does `.ci/run`, through `make test`), so a fresh machine
# gets them. Only what is missing is installed (apt is not touched on a machine that has
# everything). Not root: through sudo; when neither works, one line names the packages.
#
#   chromium              the dashboard's browser tests and benchmark (Playwright drives
#                         Debian's Chromium: Playwright's own browser download needs a CDN)
#   prometheus            the Grafana/alert-rules test scrapes real processes with it and
#                         checks the rules with its promtool
#   npm                   axe-core (npm) for the dashboard's offline accessibility audit
#   buildah mmdebstrap    edge images: root filesystem and OCI image build (edge_images/)
#   podman runc           running the images as deployed (read-only root, state volume);
#                         runc because crun refuses this kernel's hybrid cgroup layout
#   python3 python3-venv  Debian's Python 3.11, which the offline bundle installs onto
#   iproute2 util-linux   `ip` and `unshare` (network namespaces with only loopback)
#   uidmap                podman's user namespaces
#   nginx-light           the fixed upstream of benchmarks/overflow_overhead.py
#   curl                  the site runbook's commands (tests/edge_images/test_runbook.py)
#   postgresql            the coordinator's PostgreSQL store: its tests start a throwaway
#                         cluster with its initdb and pg_ctl (tests/postgres_cluster.py)
# Add a package here (with its reason) when a test needs one.
#
# `system_deps.sh arm64` (make image-cpu-arm64) adds what building the arm64 image on x86-64
# needs, never installed by CI (which does not build arm64):
#   qemu-user-static binfmt-support   qemu-aarch64 registered with binfmt_misc, so
#                                     mmdebstrap and buildah run arm64 programs emulated
set -eu
PACKAGES="chromium prometheus buildah mmdebstrap podman runc python3 python3-venv iproute2 util-linux uidmap nginx-light curl postgresql"
case "${1:-}" in
  "") ;;
  arm64) PACKAGES="$PACKAGES qemu-user-static binfmt-support" ;;
  *) echo "system_deps: unknown argument '$1' (none, or arm64)" >&2; exit 2 ;;
esac
missing=""
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing="$missing $p"
done
# npm may come with another build of Node.js than Debian's: any npm on PATH will do.
command -v npm >/dev/null 2>&1 || missing="$missing npm"
# nginx from another package (nginx, nginx-full) serves the benchmark as well.
case "$missing" in *nginx-light*) command -v nginx >/dev/null 2>&1 \
  && missing=$(echo "$missing" | sed 's/ nginx-light//') ;; esac
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo -n"
cannot() {
  echo "system_deps: cannot install the Debian packages the tests need ($1); install them and rerun: apt-get install$missing" >&2
  exit 1
}
if [ -n "$missing" ]; then
  [ -z "$SUDO" ] || command -v sudo >/dev/null 2>&1 || cannot "not root and no sudo"
  command -v apt-get >/dev/null 2>&1 || cannot "no apt-get"
  echo "system_deps: installing$missing (first run only: a few minutes)"
  $SUDO apt-get update -qq || cannot "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing \
    || cannot "apt-get install failed"
fi
if [ "${1:-}" = arm64 ]; then
  # binfmt-support's postinst registers qemu-aarch64 when binfmt_misc is mounted; a
  # container or VM may not mount it, and a reboot may leave it unregistered.
  [ -e /proc/sys/fs/binfmt_misc/status ] \
    || $SUDO mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || $SUDO update-binfmts --enable qemu-aarch64
  grep -q enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 \
    || { echo "system_deps: qemu-aarch64 is not enabled in binfmt_misc" >&2; exit 1; }
fi
