#!/usr/bin/env bash
# apt-install.sh TARGET PACKAGE...: installs the Debian packages that are
# missing, saying exactly what apt will change before it changes anything.
#
# - It asks apt for its plan first (apt-get -s install --no-upgrade) and
#   lists every package it would install, dependencies included.
# - --no-upgrade covers only the packages named, not their dependencies: a
#   plan that upgrades or removes an installed package is refused, with the
#   packages named, unless APT_UPGRADE=1.
# - No service starts during the install (a policy-rc.d that answers 101,
#   unless the system has one), and every systemd unit the install enabled
#   (a new symlink under /etc/systemd/system or /etc/systemd/user; podman
#   enables podman.socket and podman-auto-update.timer) is disabled again
#   and named.
#
# WEIGHTCACHE_POLICY_RC_D and WEIGHTCACHE_SYSTEMD_DIRS move those two paths
# for the tests (deploy/install_test.go), which run it against a fake apt.
set -euo pipefail

target=$1
shift
policy=${WEIGHTCACHE_POLICY_RC_D:-/usr/sbin/policy-rc.d}
read -r -a unitdirs <<<"${WEIGHTCACHE_SYSTEMD_DIRS:-/etc/systemd/system /etc/systemd/user}"

missing=()
for p in "$@"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} = 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "$target: ${missing[*]} missing: run make $target as root (apt-get)" >&2
	exit 1
fi

echo "$target: ${missing[*]} missing; apt-get update (refreshes the package lists only)" >&2
apt-get update -qq
plan=$(apt-get -s install -y --no-upgrade "${missing[@]}")
# Inst NAME (VERSION ...) is a new package; Inst NAME [OLD] (NEW ...) an
# upgrade; Remv NAME [OLD] a removal.
new=$(awk '$1 == "Inst" && $3 !~ /^\[/ { print $2 " " substr($3, 2) }' <<<"$plan")
changed=$(awk '$1 == "Inst" && $3 ~ /^\[/ { print "upgrade " $2 " " $3 " -> " substr($4, 2) } $1 == "Remv" { print "remove " $2 }' <<<"$plan")
if [ -n "$changed" ] && [ "${APT_UPGRADE:-}" != 1 ]; then
	{
		echo "$target: refused: installing ${missing[*]} would change installed packages:"
		sed 's/^/  /' <<<"$changed"
		echo "rerun with APT_UPGRADE=1 (make $target APT_UPGRADE=1) to allow it, or install them yourself"
	} >&2
	exit 1
fi
echo "$target: apt-get installs $(wc -l <<<"$new") packages:" >&2
sed 's/^/  /' <<<"$new" >&2
[ -n "$changed" ] && { echo "$target: and, as APT_UPGRADE=1 allows:" >&2; sed 's/^/  /' <<<"$changed" >&2; }

links() { find "${unitdirs[@]}" -type l 2>/dev/null | sort; }
before=$(links)
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\n# weightcache %s: no service starts during the install\nexit 101\n' "$target" >"$policy"
	chmod 0755 "$policy"
	trap 'rm -f "$policy"' EXIT
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-upgrade "${missing[@]}"
enabled=$(comm -13 <(echo "$before") <(links))
if [ -n "$enabled" ]; then
	echo "$target: disabled what the install enabled (systemctl enable UNIT turns one back on):" >&2
	while read -r l; do
		rm -f "$l"
		echo "  $(basename "$l") (${l%/*})" >&2
	done <<<"$enabled"
fi
