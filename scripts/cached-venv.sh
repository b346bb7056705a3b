#!/usr/bin/env bash
# cached-venv.sh LOCK WHAT: prints the path of a venv in the user's cache
# holding exactly the packages pinned in LOCK (pip install --no-deps -r),
# making it first if it is not there. It is keyed by LOCK's hash and the
# Python version, so that every clone (CI's too) reuses one install; once
# made (.complete), nothing writes to it. WHAT names it in what this says
# before it downloads anything (on stderr; stdout is the path only).
set -euo pipefail
lock=$1
what=$2
[ -f "$lock" ] || { echo "$what: no lock file $lock" >&2; exit 1; }

py=${VLLM_PYTHON:-}
if [ -z "$py" ]; then
	for c in python3.11 /usr/bin/python3; do
		if "$c" -c 'import sys, venv, ensurepip; assert sys.version_info[:2] >= (3, 11)' 2>/dev/null; then py=$c; break; fi
	done
fi
if [ -z "$py" ]; then
	[ "$(id -u)" = 0 ] || { echo "$what: no Python 3.11+ with venv: install python3-venv, or set VLLM_PYTHON" >&2; exit 1; }
	echo "$what: installing Debian's python3-venv (apt-get, nothing upgraded)" >&2
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-upgrade python3-venv >/dev/null
	py=/usr/bin/python3
fi

name=$(basename "$lock" .txt)
name=${name#requirements-}
key=$( { cat "$lock"; "$py" -c 'import sys; print(sys.version_info[:2])'; } | sha256sum | cut -c1-16)
cache=${WEIGHTCACHE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weightcache}
# The vLLM venvs kept their first name, so that caches made before stay valid.
case $name in vllm*) prefix=vllm ;; *) prefix=$name ;; esac
env=$cache/$prefix-$key
mkdir -p "$cache"
exec 9>"$cache/$prefix-env.lock"
flock 9  # two clones making the same environment wait for each other
if [ ! -e "$env/.complete" ]; then
	echo "$what: installing the $(grep -c '^[^#]' "$lock") packages pinned in $lock from PyPI into $(dirname "$env")/$(basename "$env") (once per machine; every clone reuses it)" >&2
	start=$(date +%s)
	rm -rf "$env"
	"$py" -m venv "$env"
	"$env/bin/pip" install -q --disable-pip-version-check --no-cache-dir --no-deps -r "$lock" >&2
	touch "$env/.complete"
	echo "$what: installed in $(( $(date +%s) - start )) s" >&2
fi
echo "$env"
