#!/bin/sh
# Prints the version make build links in: internal/version/VERSION at the
# release's tag v<VERSION> on a clean tree, else VERSION+<commit>[.dirty].
# Outside a git checkout, VERSION alone.
set -eu
cd "$(dirname "$0")/.."
v=$(cat internal/version/VERSION)
rev=$(git rev-parse --short=7 HEAD 2>/dev/null) || { echo "$v"; exit 0; }
dirty=
git diff --quiet HEAD 2>/dev/null || dirty=.dirty
if [ -z "$dirty" ] && [ "$(git rev-parse -q --verify "refs/tags/v$v^{commit}" 2>/dev/null)" = "$(git rev-parse HEAD)" ]; then
	echo "$v"
else
	echo "$v+$rev$dirty"
fi
