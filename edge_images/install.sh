#!/bin/sh
# edgefleet offline bundle installer: a fresh virtual environment from the bundle's
# wheelhouse (pip --no-index: no package index is needed or contacted), the model set,
# the config and, as root on a systemd box, the service unit and its user.
#
#   sudo ./install.sh                       # /opt/edgefleet/venv, /etc/edgefleet, systemd unit
#   ./install.sh --prefix DIR --no-system   # everything under DIR, no user, no unit
#
# Options: --prefix DIR (default /opt/edgefleet) --config-dir DIR (default /etc/edgefleet)
#          --models-dir DIR (default /var/lib/edgefleet/models) --python PYTHON (default
#          python3, 3.11 or newer) --no-system (skip the user and the systemd unit)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=/opt/edgefleet
config_dir=/etc/edgefleet
models_dir=/var/lib/edgefleet/models
python=python3
system=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --config-dir) config_dir=$2; shift 2 ;;
    --models-dir) models_dir=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --no-system) system=0; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "install.sh: $*" >&2; exit 1; }
command -v "$python" >/dev/null 2>&1 || fail "$python not found (Debian 12: apt-get install python3 python3-venv)"
abi=$(cat "$here/PYTHON_ABI")
have=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
[ "$have" = "$abi" ] || fail "this bundle's wheels are for $abi; $python is $have"
[ "$(uname -m)" = "$(cat "$here/MACHINE")" ] || fail "this bundle is for $(cat "$here/MACHINE"), not $(uname -m)"
"$python" -m venv "$prefix/venv" || fail "could not make a virtual environment (Debian: apt-get install python3-venv)"
"$prefix/venv/bin/pip" install --no-index --find-links "$here/wheelhouse" --no-cache-dir \
  --disable-pip-version-check --quiet -r "$here/wheelhouse/lock.txt"
"$prefix/venv/bin/pip" install --no-index --no-deps --no-cache-dir --disable-pip-version-check \
  --quiet "$here"/wheelhouse/edgefleet-*.whl
"$prefix/venv/bin/edgefleet-agent" --help >/dev/null
mkdir -p "$models_dir" "$config_dir"
if [ -d "$here/models" ]; then
  # the signed model set: the agent's read-only seed (its store is in the state directory)
  cp -R "$here/models/." "$models_dir/"
  chmod -R u=rwX,go=rX "$models_dir"
  seed='s/ *# @seed$//'
else
  seed='/# @seed$/d'  # no model set: the agent syncs its models from the coordinator
fi
if [ ! -e "$config_dir/agent.toml" ]; then
  sed -e "s#@MODELS_DIR@#$models_dir#g" -e "$seed" "$here/agent.toml" > "$config_dir/agent.toml"
  chmod 0644 "$config_dir/agent.toml"
fi
if [ "$system" = 1 ]; then
  [ "$(id -u)" = 0 ] || fail "run as root, or pass --no-system"
  id edgefleet >/dev/null 2>&1 || useradd --system --home-dir /var/lib/edgefleet-agent \
    --shell /usr/sbin/nologin edgefleet
  sed -e "s#/opt/edgefleet/venv#$prefix/venv#g" -e "s#/etc/edgefleet#$config_dir#g" \
    -e "s#/var/lib/edgefleet/models#$models_dir#g" "$here/edgefleet-agent.service" \
    > /etc/systemd/system/edgefleet-agent.service
  command -v systemctl >/dev/null 2>&1 && systemctl daemon-reload || true
  echo "installed; set coordinator.join_token and ca_file in $config_dir/agent.toml, then:"
  echo "  systemctl enable --now edgefleet-agent"
else
  echo "installed into $prefix/venv; run: $prefix/venv/bin/edgefleet-agent --config $config_dir/agent.toml"
fi
