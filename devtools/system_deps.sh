#!/bin/sh
# System packages the tests and benchmarks need (Debian 12), installed when missing:
# `.ci/run` calls this before `make test`, so a fresh machine gets them. Only what is
# missing is installed (apt is not touched on a machine that has everything).
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
#   curl                  the README runbook's commands (tests/edge_images/test_runbook.py)
# Add a package here (with its reason) when a test needs one.
set -eu
PACKAGES="chromium prometheus buildah mmdebstrap podman runc python3 python3-venv iproute2 util-linux uidmap nginx-light curl"
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
[ -z "$missing" ] && exit 0
echo "system_deps: installing$missing"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
