#!/usr/bin/env bash
# make release: tags v<VERSION> (internal/version/VERSION) at HEAD and builds
# what the docs name, each saying that version: bin/weightcache, the image
# localhost/weightcache:<VERSION> (make image) and the Python wheel
# bin/release/weightcache-<VERSION>-py3-none-any.whl. It refuses a tree with
# uncommitted changes, a Python package or chart of another version, and a
# tag of that name elsewhere. Nothing is pushed: push the tag and the image
# to your own remote and registry.
set -euo pipefail
cd "$(dirname "$0")/.."
MAKE=${MAKE:-make}
PYTHON=${PYTHON:-/usr/bin/python3}
v=$(cat internal/version/VERSION)

fail() { echo "make release: $*" >&2; exit 1; }
py=$(sed -n 's/^version = "\(.*\)"$/\1/p' python/pyproject.toml)
init=$(sed -n 's/^__version__ = "\([^"]*\)".*/\1/p' python/weightcache/__init__.py)
chart=$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' deploy/helm/weightcache/Chart.yaml)
for pair in "python/pyproject.toml:$py" "python/weightcache/__init__.py:$init" "deploy/helm/weightcache/Chart.yaml appVersion:$chart"; do
	[ "${pair##*:}" = "$v" ] || fail "${pair%:*} says ${pair##*:}, internal/version/VERSION $v: make them agree"
done
git diff --quiet HEAD || fail "uncommitted changes: commit them first (a release is a commit)"
head=$(git rev-parse HEAD)
if tagged=$(git rev-parse -q --verify "refs/tags/v$v^{commit}"); then
	[ "$tagged" = "$head" ] || fail "tag v$v exists at $tagged, not HEAD $head: bump internal/version/VERSION"
else
	git tag -a "v$v" -m "weightcache $v"
	echo "make release: tagged v$v at $head"
fi

[ "$(scripts/version.sh)" = "$v" ] || fail "scripts/version.sh says $(scripts/version.sh) at the tag"
"$MAKE" --no-print-directory build VERSION="$v"
"$MAKE" --no-print-directory image VERSION="$v" IMAGE="localhost/weightcache:$v"
mkdir -p bin/release
wheel=$("$PYTHON" -c 'import sys; sys.path.insert(0, "python/build_backend"); import wcbuild; print(wcbuild.build_wheel(sys.argv[1]))' bin/release)
[ "$wheel" = "weightcache-$v-py3-none-any.whl" ] || fail "the wheel is $wheel, not weightcache-$v-py3-none-any.whl"
echo "make release: weightcache $v"
echo "  bin/weightcache ($(bin/weightcache --version))"
echo "  image localhost/weightcache:$v"
echo "  bin/release/$wheel"
