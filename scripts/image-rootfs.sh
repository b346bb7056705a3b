#!/bin/sh
# Stages the image's root filesystem in DIR: the binary and the C library it
# loads libcuda with, the Python
# package with a dist-info (its vLLM entry point included), /etc/passwd and
# /etc/group for the nonroot user, and the run directory. Used by `make image`
# on the host and by the Containerfile's source build.
set -eu
out=${1:?usage: image-rootfs.sh DIR [VERSION]}
version=${2:-}
cd "$(dirname "$0")/.."
[ -n "$version" ] || version=$(scripts/version.sh)
rm -rf "$out"
mkdir -p "$out/usr/local/bin" "$out/opt/weightcache/python" "$out/etc" "$out/tmp"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/weightcache/weightcache/internal/version.Linked=$version" \
	-o "$out/usr/local/bin/weightcache" ./cmd/weightcache

# glibc's loader and the libraries the binary and libcuda.so.1 need: purego
# loads libcuda with dlopen, so even a CGO_ENABLED=0 binary is linked
# dynamically against the C library. The GPU runtime mounts libcuda itself.
bin=$out/usr/local/bin/weightcache
libc=$(ldd "$bin" | sed -n 's/.*libc\.so\.6 => \(\/[^ ]*\).*/\1/p')
[ -n "$libc" ] || { echo "image-rootfs.sh: ldd finds no libc.so.6 for $bin" >&2; exit 1; }
libdir=$(dirname "$libc")
for lib in $(ldd "$bin" | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p') "$libdir/libm.so.6" "$libdir/librt.so.1"; do
	real=$(readlink -f "$(dirname "$lib")")/$(basename "$lib")
	mkdir -p "$out$(dirname "$real")"
	cp -L "$lib" "$out$real"
done
# Merged /usr: /lib and /lib64 are links on the build host, and the loader's
# path (/lib64/ld-linux-x86-64.so.2) goes through them.
for d in /lib /lib64; do
	if [ -L "$d" ]; then ln -s "$(readlink "$d")" "$out$d"; fi
done

py=$out/opt/weightcache/python
cp -R python/weightcache "$py/weightcache"
find "$py" -name __pycache__ -prune -exec rm -rf {} +
pyversion=$(sed -n 's/^version = "\(.*\)"/\1/p' python/pyproject.toml)
dist=$py/weightcache-$pyversion.dist-info
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: weightcache\nVersion: %s\nSummary: %s\nRequires-Python: >=3.9\nRequires-Dist: torch\n' \
	"$pyversion" "$(sed -n 's/^description = "\(.*\)"/\1/p' python/pyproject.toml)" > "$dist/METADATA"
# The entry point is read from pyproject.toml, so the two cannot drift.
ep=$(sed -n '/^\[project.entry-points."vllm.general_plugins"\]/,/^\[/{/=/p}' python/pyproject.toml | tr -d '"')
printf '[vllm.general_plugins]\n%s\n' "$ep" > "$dist/entry_points.txt"
printf 'weightcache\n' > "$dist/top_level.txt"
printf 'weightcache image\n' > "$dist/INSTALLER"
(cd "$py" && find weightcache "weightcache-$pyversion.dist-info" -type f | sort | sed 's/$/,,/') > "$dist/RECORD"

printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$out/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$out/etc/group"
chmod 1777 "$out/tmp"
