#!/usr/bin/env bash
# gpu-check.sh: the CUDA backend's check on a real GPU (issues 5 and 10).
# Also the vLLM loader's tier 2 on the GPU (scripts/gpu-tier2.py), vLLM's
# compile artifacts restored from the daemon (scripts/gpu-restart.py), a running
# vLLM switched to another version in place (python/bench_switch.py), and the
# cache outliving a GPU rank and a preload (--takeover; issue 18), and GPU
# ranks seeded from a peer over loopback (issue 29), and several models on
# the GPU under one budget (weightcache serve, issue 45).
#
# Builds weightcache, writes `synth --preset medium` (219 tensors, 1.4 GB),
# measures plain host-to-device copies of those bytes, preloads them on one
# GPU from the page cache, attaches from Go (and from Python through ctypes
# on libcuda when python3 is there; through torch too when it has CUDA),
# checks every byte against the files, kills the daemon while a zero_copy
# engine holds the memory and reads it again, publishes the checkpoint into
# GPU memory and attaches the result, runs TP 2 where two GPUs are visible,
# and prints every figure (preload GB/s against the pinned ceiling).
#
# Needs: the Go toolchain (or WEIGHTCACHE_BIN=prebuilt binary), the machine's
# NVIDIA driver, coreutils; optionally python3 and PyTorch.
# Environment:
#   GPU_CHECK_DEVICE     GPU to use (default cuda:0: the first visible GPU)
#   GPU_CHECK_TP_DEVICES the two GPUs of the TP 2 check (default cuda:0,cuda:1)
#   GPU_CHECK_PRESET     synth preset (default medium)
#   GPU_CHECK_PEER_PORT  loopback port of the peer check (default 7391)
#   WEIGHTCACHE_BIN      use this binary instead of building one
#   GPU_CHECK_CGO=1      build with cgo (default: CGO_ENABLED=0, as shipped), to
#                        tell a purego problem from a driver one
#   WEIGHTCACHE_LIBCUDA  driver library to load (a fake one, for dry runs)
# Exit status: 0 all checks and targets pass; 1 a check failed; 3 every
# check passed but a performance target was missed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVICE=${GPU_CHECK_DEVICE:-cuda:0}
PRESET=${GPU_CHECK_PRESET:-medium}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
SOCK=$WORK/sock
mkdir -m 700 "$SOCK"
PIDS=()
FAILED=0
MISSED=0

cleanup() {
	local pid
	for pid in ${PIDS[@]+"${PIDS[@]}"}; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	sleep 0.5
	for pid in ${PIDS[@]+"${PIDS[@]}"}; do
		kill -KILL "$pid" 2>/dev/null || true
	done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "gpu-check: interrupted" >&2; exit 130' INT TERM

say() { printf '%s\n' "$*"; }
die() {
	printf 'gpu-check: FAIL: %s\n' "$*" >&2
	exit 1
}
check() { # check NAME OK(0|1) DETAIL
	if [[ $2 == 1 ]]; then
		say "  check   $1: ok${3:+ ($3)}"
	else
		say "  check   $1: FAILED${3:+ ($3)}"
		FAILED=1
	fi
}
target() { # target NAME MET(0|1) DETAIL
	if [[ $2 == 1 ]]; then
		say "  target  $1: met ($3)"
	else
		say "  target  $1: MISSED ($3)"
		MISSED=1
	fi
}
# step SECONDS NAME CMD...: run CMD with a time limit, saying what timed out.
step() {
	local limit=$1 name=$2
	shift 2
	local rc=0
	timeout --kill-after=5 "$limit" "$@" || rc=$?
	if [[ $rc == 124 || $rc == 137 ]]; then
		die "$name did not finish within ${limit}s"
	fi
	return "$rc"
}
# field JSON KEY: a scalar field of a one-line JSON object (no jq needed).
field() {
	sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[^,}]*\).*/\1/p" <<<"$1" | tr -d '"' | head -n1
}
calc() { awk "BEGIN { printf \"%.${2:-2}f\", $1 }"; }
ge() { awk "BEGIN { exit !($1 >= $2) }" && echo 1 || echo 0; }
# await_line OUT PID: wait up to 120 s for a first line in OUT while PID
# runs; the caller checks what came.
await_line() {
	for _ in $(seq 6000); do
		[[ -s $1 ]] && break
		kill -0 "$2" 2>/dev/null || break
		sleep 0.02
	done
}

say "gpu-check: work directory $WORK"

# 1. Build.
if [[ -n ${WEIGHTCACHE_BIN:-} ]]; then
	BIN=$WEIGHTCACHE_BIN
elif ! command -v go >/dev/null && [[ -x $ROOT/bin/weightcache ]]; then
	BIN=$ROOT/bin/weightcache
	say "go not found: using the prebuilt $BIN"
else
	command -v go >/dev/null || die "go not found (build bin/weightcache elsewhere with make build, or set WEIGHTCACHE_BIN)"
	BIN=$WORK/weightcache
	(cd "$ROOT" && export CGO_ENABLED=${GPU_CHECK_CGO:-0} && step 180 "go build" go build -o "$BIN" ./cmd/weightcache) || die "go build failed"
fi
[[ -x $BIN ]] || die "$BIN is not an executable"
say "binary:   $BIN"

# 2. Checkpoint, read once so that the preload reads from the page cache.
MODEL=$WORK/model
step 120 "synth" "$BIN" synth --preset "$PRESET" --out "$MODEL" >/dev/null || die "synth failed"
cat "$MODEL"/*.safetensors >/dev/null
FILE_BYTES=$(cat "$MODEL"/*.safetensors | wc -c)

# 3. Baselines: plain copies of the same bytes through the same binding.
BENCH=$(step 120 "cuda-bench" "$BIN" cuda-bench --model "$MODEL" --device "$DEVICE") || die "cuda-bench failed on $DEVICE"
UUID=$(field "$BENCH" device)
say "device:   $UUID ($(field "$BENCH" name))"
PAGEABLE=$(field "$BENCH" pageable_gbps)
PINNED=$(field "$BENCH" pinned_gbps)

# 4. Preload on the GPU. load_seconds is the load itself; the wall time from
# process start also counts driver and context start-up and staging pinning.
T0=$(date +%s.%N)
"$BIN" preload --model "$MODEL" --socket-dir "$SOCK" --devices "$UUID" >"$WORK/preload.out" 2>"$WORK/preload.err" &
DAEMON=$!
PIDS+=("$DAEMON")
for _ in $(seq 6000); do
	[[ -s $WORK/preload.out ]] && break
	kill -0 "$DAEMON" 2>/dev/null || die "preload exited: $(tail -n 3 "$WORK/preload.err")"
	sleep 0.02
done
WALL_S=$(calc "$(date +%s.%N) - $T0" 3)
READY=$(head -n1 "$WORK/preload.out")
[[ $(field "$READY" event) == ready ]] || die "preload not ready within 120s: $(tail -n 3 "$WORK/preload.err")"
# The loader's own time where the launcher loaded (driver start-up apart).
LOAD_S=$(field "$READY" loader_seconds)
[[ -n $LOAD_S ]] || LOAD_S=$(field "$READY" load_seconds)
TENSORS=$(field "$READY" tensors)
PRELOAD=$(calc "$FILE_BYTES / $LOAD_S / 1e9")

# 5. Attach from Go: five timed attaches, then one that reads every byte.
ATTACH_MS=()
for _ in 1 2 3 4 5; do
	A=$(step 60 "attach" "$BIN" attach --model "$MODEL" --socket-dir "$SOCK" --device "$DEVICE" --fallback=false --json) || die "attach failed: $A"
	ATTACH_MS+=("$(calc "$(field "$A" attach_seconds) * 1000")")
done
MEDIAN_MS=$(printf '%s\n' "${ATTACH_MS[@]}" | sort -n | sed -n 3p)
INIT_MS=$(calc "$(field "$A" driver_init_seconds) * 1000")
A=$(step 120 "attach --verify" "$BIN" attach --model "$MODEL" --socket-dir "$SOCK" --device "$DEVICE" --fallback=false --json --verify) || die "attach --verify failed: $A"
READ_ONLY=$(field "$A" read_only)
check "every tensor matches the daemon's CRC-32C" "$([[ $(field "$A" verified) == true ]] && echo 1 || echo 0)"
step 120 "attach --digest" "$BIN" attach --model "$MODEL" --socket-dir "$SOCK" --device "$DEVICE" --fallback=false --digest |
	grep -E '^[0-9a-f]{64}  ' >"$WORK/gpu.digest" || die "attach --digest failed"
mkdir -m 700 "$WORK/nosock"
step 120 "fallback attach" "$BIN" attach --model "$MODEL" --socket-dir "$WORK/nosock" --digest |
	grep -E '^[0-9a-f]{64}  ' >"$WORK/disk.digest" || die "fallback attach failed"
N_DIGESTS=$(wc -l <"$WORK/disk.digest")
check "GPU bytes equal the files' bytes (SHA-256 of $N_DIGESTS tensors)" "$(cmp -s "$WORK/gpu.digest" "$WORK/disk.digest" && echo 1 || echo 0)"

# 6. Attach from Python through ctypes on libcuda (torch where it has CUDA).
PY_LINE="skipped (no python3)"
if command -v python3 >/dev/null; then
	"$BIN" status --socket-dir "$SOCK" --json >"$WORK/status.json"
	if PY_OUT=$(WC_INDEX_PY=$ROOT/python/weightcache/index.py step 120 "python attach" python3 - "$SOCK" "$WORK/status.json" "$WORK/gpu.digest" <<'PY'
import ctypes, hashlib, json, os, socket, struct, sys, time

sock_dir, status_file, digest_file = sys.argv[1:4]
st = json.load(open(status_file))[0]
want = dict(reversed(l.split()) for l in open(digest_file))
cu = ctypes.CDLL(os.environ.get("WEIGHTCACHE_LIBCUDA") or "libcuda.so.1")

def ck(r, call):
    if r != 0:
        name = ctypes.c_char_p()
        cu.cuGetErrorName(r, ctypes.byref(name))
        raise SystemExit(f"{call}: {name.value.decode() if name.value else r}")

class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]

u64, size_t = ctypes.c_uint64, ctypes.c_size_t
cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), size_t, size_t, u64, ctypes.c_ulonglong]
cu.cuMemMap.argtypes = [u64, size_t, size_t, ctypes.c_ulonglong, ctypes.c_ulonglong]
cu.cuMemSetAccess.argtypes = [u64, size_t, ctypes.POINTER(Access), size_t]
cu.cuMemImportFromShareableHandle.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_void_p, ctypes.c_int]
cu.cuMemRelease.argtypes = [ctypes.c_ulonglong]
cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, u64, size_t]
ck(cu.cuInit(0), "cuInit")
n = ctypes.c_int()
ck(cu.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
ordinal = None
for i in range(n.value):
    d, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
    ck(cu.cuDeviceGet(ctypes.byref(d), i), "cuDeviceGet")
    ck(cu.cuDeviceGetUuid_v2(raw, d), "cuDeviceGetUuid_v2")
    h = bytes(raw).hex()
    if "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]) == st["device"]:
        ordinal, dev = i, d
if ordinal is None:
    raise SystemExit(f"daemon's GPU {st['device']} is not visible to python")
ctx = ctypes.c_void_p()
ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

def send(s, msg):
    body = json.dumps(msg).encode()
    s.sendall(struct.pack(">I", len(body)) + body)

def recv(s):
    data, fds = b"", []
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        chunk, anc, _, _ = s.recvmsg(1 << 20, socket.CMSG_SPACE(253 * 4))
        if not chunk:
            raise SystemExit("daemon closed the connection")
        data += chunk
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += list(struct.unpack("%di" % (len(payload) // 4), payload[: len(payload) // 4 * 4]))
    msg = json.loads(data[4:])
    if msg["type"] == "error":
        raise SystemExit(f"daemon: {msg}")
    return msg, fds

t0 = time.perf_counter()
s = socket.socket(socket.AF_UNIX)
s.connect(st["socket"])
send(s, {"type": "hello", "version": 2, "fingerprint": st["fingerprint"], "device": st["device"], "mode": "zero_copy", "client": "gpu-check python"})
ok, _ = recv(s)
assert ok["type"] == "ok" and ok["state"] == "ready", ok
send(s, {"type": "manifest", "version": 2})
man, fds = recv(s)
# The last descriptor is the manifest index (docs/protocol.md), read in place.
import importlib.util, mmap
# index.py stands alone (struct only): loaded without the package, which needs torch.
spec = importlib.util.spec_from_file_location("wcindex", os.environ["WC_INDEX_PY"])
wcindex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wcindex)
index = wcindex.Index(mmap.mmap(fds[-1], man["index_size"], prot=mmap.PROT_READ))
os.close(fds.pop())
tensors = []
for i in range(len(index)):
    name, _, _, segment, offset, nbytes, _ = index.entry(i)
    tensors.append({"name": name, "segment": segment, "offset": offset, "nbytes": nbytes})
bases, read_only = [], True
for seg, fd in zip(man["segments"], fds):
    assert seg["handle"] == "cuda_fd", seg
    h, ptr = ctypes.c_ulonglong(), u64()
    ck(cu.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd), 1), "cuMemImportFromShareableHandle")
    ck(cu.cuMemAddressReserve(ctypes.byref(ptr), seg["size"], seg.get("align", 0), 0, 0), "cuMemAddressReserve")
    ck(cu.cuMemMap(ptr, seg["size"], 0, h, 0), "cuMemMap")
    if cu.cuMemSetAccess(ptr, seg["size"], ctypes.byref(Access(Loc(1, ordinal), 1)), 1) != 0:
        read_only = False
        ck(cu.cuMemSetAccess(ptr, seg["size"], ctypes.byref(Access(Loc(1, ordinal), 3)), 1), "cuMemSetAccess")
    ck(cu.cuMemRelease(h), "cuMemRelease")
    os.close(fd)
    bases.append(ptr.value)
attach_ms = (time.perf_counter() - t0) * 1000
bad = 0
for t in tensors:
    buf = ctypes.create_string_buffer(max(t["nbytes"], 1))
    ck(cu.cuMemcpyDtoH_v2(buf, bases[t["segment"]] + t["offset"], t["nbytes"]), "cuMemcpyDtoH_v2")
    bad += hashlib.sha256(buf.raw[: t["nbytes"]]).hexdigest() != want[t["name"]]
torch_note = "no torch with CUDA"
try:
    import torch
    if torch.cuda.is_available():
        t = max(tensors, key=lambda t: t["nbytes"])
        # torch refuses a read-only flag here; the mapping's access flags
        # are what keep the memory read-only.
        class View:
            __cuda_array_interface__ = {"shape": (t["nbytes"],), "typestr": "|u1", "version": 3,
                                        "data": (bases[t["segment"]] + t["offset"], False)}
        # The runtime may number GPUs differently from the driver: match UUIDs.
        tdev = ordinal
        for i in range(torch.cuda.device_count()):
            if str(getattr(torch.cuda.get_device_properties(i), "uuid", "")) == st["device"][4:]:
                tdev = i
        torch.cuda.set_device(tdev)
        x = torch.as_tensor(View(), device=f"cuda:{tdev}")
        same = hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest() == want[t["name"]]
        torch_note = f"torch {torch.__version__} reads {t['name']} in place: {'ok' if same else 'MISMATCH'}"
        bad += not same
except ImportError:
    pass
print(json.dumps({"attach_ms": attach_ms, "tensors": len(tensors), "segments": len(bases), "mismatches": bad, "read_only": read_only, "torch": torch_note}, separators=(",", ":")))
PY
	); then
		PY_MS=$(calc "$(field "$PY_OUT" attach_ms)")
		PY_BAD=$(field "$PY_OUT" mismatches)
		PY_LINE="$PY_MS ms, $(field "$PY_OUT" tensors) tensors, read_only=$(field "$PY_OUT" read_only); $(field "$PY_OUT" torch)"
		check "python ctypes attach reads the files' bytes" "$([[ $PY_BAD == 0 ]] && echo 1 || echo 0)" "$PY_BAD mismatches"
	else
		PY_LINE="FAILED: $PY_OUT"
		check "python ctypes attach" 0 "$PY_OUT"
	fi
fi

# 6b. Attach through the weightcache Python package, as an engine would.
PKG_LINE="skipped (no python3 with torch and CUDA)"
if command -v python3 >/dev/null && python3 -c 'import torch,sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
	if PKG_OUT=$(PYTHONPATH=$ROOT/python step 120 "python package attach" python3 - "$MODEL" "$SOCK" "$WORK/gpu.digest" <<'PY'
import hashlib, json, sys, time
import torch
from weightcache import attach

model, sock, digest_file = sys.argv[1:4]
want = dict(reversed(l.split()) for l in open(digest_file))
t0 = time.perf_counter()
weights, info = attach(model, device="cuda:0", socket_dir=sock, fallback=False)
ms = (time.perf_counter() - t0) * 1000
bad = sum(hashlib.sha256(t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest() != want[n]
          for n, t in weights.items())
devs = sorted({str(t.device) for t in weights.values()})
print(json.dumps({"source": info.source, "attach_ms": ms, "tensors": len(weights), "mismatches": bad, "devices": ",".join(devs)}, separators=(",", ":")))
PY
	); then
		PKG_LINE="$(calc "$(field "$PKG_OUT" attach_ms)") ms, $(field "$PKG_OUT" tensors) tensors on $(field "$PKG_OUT" devices), source $(field "$PKG_OUT" source)"
		check "python package attach(device=cuda:0) reads the files' bytes" "$([[ $(field "$PKG_OUT" mismatches) == 0 && $(field "$PKG_OUT" source) == hit ]] && echo 1 || echo 0)" "$PKG_LINE"
	else
		PKG_LINE="FAILED: $PKG_OUT"
		check "python package attach" 0 "$PKG_OUT"
	fi
fi

# 7a. The cache outlives the rank (issue 18). With no engine attached, the
# launcher holds the only reference to the GPU segments: the exported VMM
# descriptors it kept (it released its own allocation handles after the
# load). Kill the rank: if the replacement imports those descriptors, a VMM
# allocation survives the death of the process that imported it while only
# an exported descriptor is held elsewhere (what systemd's fd store needs
# for a GPU crash); if not, the launcher reloads the rank ("reloaded":true).
RANK_PID=$(grep -o '"ranks":.*' <<<"$READY" | grep -o '"pid":[0-9]*' | head -n1 | cut -d: -f2)
kill -KILL "$RANK_PID"
for _ in $(seq 3000); do
	grep -q '"event":"rank_restarted"' "$WORK/preload.out" && break
	sleep 0.02
done
RESTART=$(grep '"event":"rank_restarted"' "$WORK/preload.out" | head -n1)
check "a killed GPU rank is replaced" "$([[ -n $RESTART ]] && echo 1 || echo 0)" "${RESTART:-no rank_restarted line: $(tail -n 3 "$WORK/preload.err")}"
RELOADED=$(field "$RESTART" reloaded)
SURVIVES=$([[ ${RELOADED:-false} == true ]] && echo no || echo yes)
A=$(step 120 "attach --verify after the restart" "$BIN" attach --model "$MODEL" --socket-dir "$SOCK" --device "$DEVICE" --fallback=false --json --verify) || true
check "bytes after the GPU rank restart" "$([[ $(field "$A" verified) == true ]] && echo 1 || echo 0)" "$A"
RESTART_LINE="$(field "$RESTART" seconds) s, reloaded ${RELOADED:-false}; VMM allocation survives its importer with only an exported descriptor held: $SURVIVES"

# 7b. --takeover on the GPU: a second preload takes the segments over as
# VMM descriptors (imported as an engine does, while the first still runs).
"$BIN" preload --model "$MODEL" --socket-dir "$SOCK" --devices "$UUID" --takeover >"$WORK/takeover.out" 2>"$WORK/takeover.err" &
SUCC=$!
PIDS+=("$SUCC")
await_line "$WORK/takeover.out" "$SUCC"
TREADY=$(head -n1 "$WORK/takeover.out")
check "--takeover on the GPU (source takeover, 0 bytes read)" \
	"$([[ $(field "$TREADY" source) == takeover && $(field "$TREADY" read_bytes) == 0 ]] && echo 1 || echo 0)" "${TREADY:-$(tail -n 3 "$WORK/takeover.err")}"
{ wait "$DAEMON" || true; } 2>/dev/null
A=$(step 120 "attach --verify after the takeover" "$BIN" attach --model "$MODEL" --socket-dir "$SOCK" --device "$DEVICE" --fallback=false --json --verify) || true
check "bytes after the GPU takeover" "$([[ $(field "$A" verified) == true ]] && echo 1 || echo 0)" "$A"
TAKEOVER_LINE="$(field "$TREADY" load_seconds) s to ready, source $(field "$TREADY" source), read_bytes $(field "$TREADY" read_bytes)"
if [[ $(field "$TREADY" source) == takeover ]]; then
	DAEMON=$SUCC
fi

# 7. A zero_copy engine keeps its memory when the daemon dies.
"$BIN" attach --model "$MODEL" --socket-dir "$SOCK" --device "$DEVICE" --fallback=false --json --verify --reread --hold 120s >"$WORK/engine.out" 2>"$WORK/engine.err" &
ENGINE=$!
PIDS+=("$ENGINE")
for _ in $(seq 600); do
	[[ -s $WORK/engine.out ]] && break
	kill -0 "$ENGINE" 2>/dev/null || die "zero_copy engine exited: $(tail -n 3 "$WORK/engine.err")"
	sleep 0.1
done
[[ $(field "$(head -n1 "$WORK/engine.out")" verified) == true ]] || die "zero_copy engine did not verify: $(cat "$WORK/engine.out" "$WORK/engine.err")"
# Braces keep bash's "Killed" job notice out of the report.
{
	kill -KILL "$DAEMON"
	wait "$DAEMON" || true
} 2>/dev/null
kill -USR1 "$ENGINE"
ENGINE_RC=0
step 120 "engine reread" bash -c "while kill -0 $ENGINE 2>/dev/null; do sleep 0.1; done" || true
wait "$ENGINE" || ENGINE_RC=$?
SECOND=$(sed -n 2p "$WORK/engine.out")
check "zero_copy memory survives daemon death (SIGKILL, then every tensor re-verified)" \
	"$([[ $ENGINE_RC == 0 && $(field "$SECOND" reread) == true && $(field "$SECOND" verified) == true ]] && echo 1 || echo 0)" \
	"engine exit $ENGINE_RC${SECOND:+, $SECOND}"

# wait_ready OUT ERR PID: wait for a preload's ready line; print it.
wait_ready() {
	for _ in $(seq 6000); do
		[[ -s $1 ]] && break
		kill -0 "$3" 2>/dev/null || die "preload exited: $(tail -n 3 "$2")"
		sleep 0.02
	done
	[[ $(field "$(head -n1 "$1")" event) == ready ]] || die "preload not ready within 120s: $(tail -n 3 "$2")"
	head -n1 "$1"
}
stop() { # stop PID: SIGTERM and wait
	kill -TERM "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# 8. Publish into the GPU: an engine fills fresh GPU segments of a
# --publish-only daemon, commits, and others attach the result zero-copy.
PSOCK=$WORK/psock
mkdir -m 700 "$PSOCK"
"$BIN" preload --model "$MODEL" --socket-dir "$PSOCK" --devices "$UUID" --publish-only >"$WORK/pub.out" 2>"$WORK/pub.err" &
PUBD=$!
PIDS+=("$PUBD")
wait_ready "$WORK/pub.out" "$WORK/pub.err" "$PUBD" >/dev/null
P=$(step 120 "publish" "$BIN" publish --model "$MODEL" --socket-dir "$PSOCK" --device "$DEVICE" --engine gpu-check --engine-version 1 --json) || die "publish failed: $P"
PUB_S=$(field "$P" publish_seconds)
PUB_N=$(field "$P" tensors)
A=$(step 60 "attach published" "$BIN" attach --model "$MODEL" --socket-dir "$PSOCK" --device "$DEVICE" --engine gpu-check --engine-version 1 --fallback=false --json) || die "attach of the published layout failed: $A"
PUB_ATTACH_MS=$(calc "$(field "$A" attach_seconds) * 1000")
PUB_RO=$(field "$A" read_only)
step 120 "attach published --digest" "$BIN" attach --model "$MODEL" --socket-dir "$PSOCK" --device "$DEVICE" --engine gpu-check --engine-version 1 --fallback=false --digest |
	grep -E '^[0-9a-f]{64}  ' >"$WORK/pub.digest" || die "attach --digest of the published layout failed"
check "published GPU layout equals the files' bytes ($PUB_N tensors), mapped read-only" \
	"$([[ $PUB_RO == true ]] && cmp -s "$WORK/pub.digest" "$WORK/disk.digest" && echo 1 || echo 0)" "read_only=$PUB_RO"
stop "$PUBD"

# 9. Tensor parallelism on GPUs: TP 2 from one read of the checkpoint, each
# rank found from its ranks alone and equal to the plan's slice read from
# disk. Needs two visible GPUs (a device key names one GPU, so two ranks
# cannot share one); the fake driver runs it with two fake devices.
TP_LINE="skipped"
TSOCK=$WORK/tsock
mkdir -m 700 "$TSOCK"
TP_DEVICES=${GPU_CHECK_TP_DEVICES:-cuda:0,cuda:1}
"$BIN" preload --model "$MODEL" --socket-dir "$TSOCK" --devices "$TP_DEVICES" --tensor-parallel-size 2 >"$WORK/tp.out" 2>"$WORK/tp.err" &
TPD=$!
PIDS+=("$TPD")
await_line "$WORK/tp.out" "$TPD"
if [[ -s $WORK/tp.out ]]; then
	TPR=$(head -n1 "$WORK/tp.out")
	TP_OK=1
	for r in 0 1; do
		step 120 "tp attach" "$BIN" attach --model "$MODEL" --socket-dir "$TSOCK" --tensor-parallel-size 2 --tp-rank "$r" --fallback=false --digest |
			grep -E '^[0-9a-f]{64}  ' >"$WORK/tp$r.digest" || TP_OK=0
		step 120 "tp fallback" "$BIN" attach --model "$MODEL" --socket-dir "$WORK/nosock" --tensor-parallel-size 2 --tp-rank "$r" --digest |
			grep -E '^[0-9a-f]{64}  ' >"$WORK/tpdisk$r.digest" || TP_OK=0
		cmp -s "$WORK/tp$r.digest" "$WORK/tpdisk$r.digest" || TP_OK=0
	done
	TP_READ=$(field "$TPR" read_bytes)
	TP_DATA=$(field "$TPR" data_bytes)
	TP_LINE="read $TP_READ bytes for $TP_DATA bytes of tensors, $(calc "$TP_DATA / $(field "$TPR" load_seconds) / 1e9") GB/s"
	check "TP 2 on $TP_DEVICES: read once, each rank the plan's slice" "$([[ $TP_OK == 1 && $TP_READ == "$TP_DATA" ]] && echo 1 || echo 0)" "$TP_LINE"
	stop "$TPD"
else
	TP_LINE="skipped: $(tail -n 1 "$WORK/tp.err")"
fi

# 10. Tier 2 of the vLLM loader on the GPU (fake vLLM's model classes, CUDA
# tensors): the first start loads tier 1 from a host daemon and publishes
# its processed weights into the GPU's own publish-only daemon; the restart
# maps them there zero-copy. Restart time against tier 1 and auto.
T2_LINE="skipped (no python3 with torch and CUDA)"
if command -v python3 >/dev/null && python3 -c 'import torch,sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
	T2SOCK=$WORK/t2sock
	mkdir -m 700 "$T2SOCK"
	"$BIN" preload --model "$MODEL" --socket-dir "$T2SOCK" --devices host >"$WORK/t2h.out" 2>"$WORK/t2h.err" &
	T2H=$!
	PIDS+=("$T2H")
	"$BIN" preload --model "$MODEL" --socket-dir "$T2SOCK" --devices "$UUID" --publish-only >"$WORK/t2g.out" 2>"$WORK/t2g.err" &
	T2G=$!
	PIDS+=("$T2G")
	wait_ready "$WORK/t2h.out" "$WORK/t2h.err" "$T2H" >/dev/null
	wait_ready "$WORK/t2g.out" "$WORK/t2g.err" "$T2G" >/dev/null
	if T2_OUT=$(step 300 "tier 2 on the GPU" python3 "$ROOT/scripts/gpu-tier2.py" "$MODEL" "$T2SOCK" "$DEVICE" 2>"$WORK/t2.err" | tail -n 1); then
		T2_LINE="auto $(calc "$(field "$T2_OUT" auto_s)" 3) s, tier 1 $(calc "$(field "$T2_OUT" tier1_s)" 3) s, tier-2 hit $(calc "$(field "$T2_OUT" tier2_s)" 3) s; CUDA allocator gained $(field "$T2_OUT" auto_bytes) / $(field "$T2_OUT" tier1_bytes) / $(field "$T2_OUT" tier2_bytes) bytes"
		check "tier 2 restart on the GPU: identical logits" "$([[ $(field "$T2_OUT" identical) == True || $(field "$T2_OUT" identical) == true ]] && echo 1 || echo 0)" "$T2_LINE"
		check "tier 2 restart maps the GPU daemon's memory (no copy into allocator memory)" "$(ge "$(field "$T2_OUT" tier1_bytes)" "4 * $(field "$T2_OUT" tier2_bytes)")" "$(field "$T2_OUT" tier2_bytes) bytes allocated"
	else
		check "tier 2 on the GPU" 0 "$(tail -n 5 "$WORK/t2.err")"
	fi
	kill -TERM "$T2H" "$T2G" 2>/dev/null || true
fi

# 10a. vLLM's compile artifacts on the GPU (issue 42): real vLLM with CUDA
# and its default torch.compile, the same start twice with an emptied
# compile cache each time; the second has the first's artifacts restored
# from the daemon. Compile time as vLLM reports it, both starts.
RESTART_ART_LINE="skipped (no python3 with vLLM and CUDA)"
if command -v python3 >/dev/null && python3 -c 'import torch,vllm,sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
	if RA_OUT=$(step 600 "compile artifacts on the GPU" python3 "$ROOT/scripts/gpu-restart.py" "$BIN" "$WORK" 2>"$WORK/ra.err" | tail -n 1); then
		RESTART_ART_LINE="first start $(calc "$(field "$RA_OUT" first_ready_s)" 1) s (vLLM compile $(field "$RA_OUT" first_compile_s) s), restored start $(calc "$(field "$RA_OUT" second_ready_s)" 1) s (vLLM compile $(field "$RA_OUT" second_compile_s) s)"
		check "compile artifacts published by the first GPU start" "$([[ $(field "$RA_OUT" published) == true ]] && echo 1 || echo 0)" "$RA_OUT"
		check "compile artifacts restored into the second's empty cache" "$([[ $(field "$RA_OUT" restored) == true ]] && echo 1 || echo 0)" "$RA_OUT"
		check "restored start generates what the compiling one did" "$([[ $(field "$RA_OUT" identical) == true ]] && echo 1 || echo 0)" "$RA_OUT"
	else
		check "compile artifacts on the GPU" 0 "$(tail -n 5 "$WORK/ra.err")"
	fi
fi

# 10c. A running vLLM engine on the GPU switched to another version of its
# model in place (weightcache.vllm.switch, issue 45): python/bench_switch.py,
# one round (1.6 GB v1 and v2 made once under $TMPDIR), against restarts.
SWITCH_LINE="skipped (no python3 with vLLM and CUDA)"
if command -v python3 >/dev/null && python3 -c 'import torch,vllm,sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
	if SW_OUT=$(step 600 "switch in place on the GPU" python3 "$ROOT/python/bench_switch.py" --bin "$BIN" --runs 1 2>"$WORK/sw.err" | tail -n 2 | tr '\n' ' '); then
		SWITCH_LINE="$SW_OUT"
		check "switched engine generates what a fresh v2 does, and back on v1 what it did" "$([[ $SW_OUT == *"fresh v2 engine does: True"*"did before the switches: True"* ]] && echo 1 || echo 0)" "$SW_OUT"
	else
		check "switch in place on the GPU" 0 "$(tail -n 5 "$WORK/sw.err")"
	fi
fi

# 10b. A GPU rank seeded from a peer (issue 29): a host preload serves the
# checkpoint's pieces on loopback; a GPU preload fills its device segments
# from them, through the pinned staging path it uses for files, checks
# every piece against the host's manifest digest and reads none of the
# files. Its bytes are then compared with the files'.
PEER_LINE="not run"
PEER_PORT=${GPU_CHECK_PEER_PORT:-7391}
PHSOCK=$WORK/peerhsock
PGSOCK=$WORK/peergsock
mkdir -m 700 "$PHSOCK" "$PGSOCK"
printf 'gpu-check-peer-token\n' >"$WORK/peer.token"
chmod 600 "$WORK/peer.token"
"$BIN" preload --model "$MODEL" --socket-dir "$PHSOCK" --devices host --peer-listen "127.0.0.1:$PEER_PORT" \
	--peer-token-file "$WORK/peer.token" >"$WORK/peerh.out" 2>"$WORK/peerh.err" &
PH=$!
PIDS+=("$PH")
PHR=$(wait_ready "$WORK/peerh.out" "$WORK/peerh.err" "$PH")
T0=$(date +%s.%N)
"$BIN" preload --model "$MODEL" --socket-dir "$PGSOCK" --devices "$UUID" --peers "127.0.0.1:$PEER_PORT" \
	--peer-token-file "$WORK/peer.token" --peer-manifest-digest "$(field "$PHR" peer_manifest)" >"$WORK/peerg.out" 2>"$WORK/peerg.err" &
PG=$!
PIDS+=("$PG")
PGR=$(wait_ready "$WORK/peerg.out" "$WORK/peerg.err" "$PG")
PEER_S=$(calc "$(date +%s.%N) - $T0" 3)
PEER_LINE="$(field "$PGR" peer_bytes) bytes from the peer, $(field "$PGR" storage_bytes) from storage, $PEER_S s spawn to ready ($(calc "$FILE_BYTES / $PEER_S / 1e9") GB/s)"
check "GPU ranks seeded from a peer read no file" "$([[ $(field "$PGR" source) == peers && $(field "$PGR" storage_bytes) == 0 && $(field "$PGR" peer_bytes) == "$FILE_BYTES" ]] && echo 1 || echo 0)" "$PEER_LINE"
step 120 "attach --digest (seeded from a peer)" "$BIN" attach --model "$MODEL" --socket-dir "$PGSOCK" --device "$DEVICE" --fallback=false --digest |
	grep -E '^[0-9a-f]{64}  ' >"$WORK/peer.digest" || true
check "GPU bytes seeded from a peer equal the files' bytes" "$(cmp -s "$WORK/peer.digest" "$WORK/disk.digest" && echo 1 || echo 0)"
stop "$PG"
stop "$PH"

# 10d. Several models on the GPU under one budget (weightcache serve, issue
# 45): the medium checkpoint and two tiny ones resident, the medium one
# attached through the managed directory byte for byte; then a copy of the
# medium one evicts the least recently used models without a lease (the
# first tiny one, then the medium one, attached since) and serves the same
# bytes.
SERVE_LINE="not run"
SVSOCK=$WORK/servesock
mkdir -m 700 "$SVSOCK"
for t in tiny1 tiny2; do
	step 60 "synth $t" "$BIN" synth --preset tiny --out "$WORK/$t" >/dev/null || die "synth $t failed"
done
step 300 "copy of the checkpoint" cp -r "$MODEL" "$WORK/model2" || die "copy of the checkpoint failed"
"$BIN" serve --socket-dir "$SVSOCK" --devices "$DEVICE" --memory-budget $((FILE_BYTES + 8 * 1048576)) --model "$MODEL" \
	>"$WORK/serve.out" 2>"$WORK/serve.err" &
SV=$!
PIDS+=("$SV")
for _ in $(seq 6000); do
	[[ -s $WORK/serve.out ]] && break
	kill -0 "$SV" 2>/dev/null || break
	sleep 0.02
done
if [[ $(field "$(head -n1 "$WORK/serve.out")" event) == serving ]]; then
	step 60 "load tiny1" "$BIN" load --socket-dir "$SVSOCK" --model "$WORK/tiny1" >/dev/null || check "serve: load tiny1" 0 "$(tail -n 3 "$WORK/serve.err")"
	step 120 "attach --digest (serve)" "$BIN" attach --model "$MODEL" --socket-dir "$SVSOCK" --device "$DEVICE" --fallback=false --digest |
		grep -E '^[0-9a-f]{64}  ' >"$WORK/serve.digest" || true
	check "serve: the medium model on the GPU equals the files" "$(cmp -s "$WORK/serve.digest" "$WORK/disk.digest" && echo 1 || echo 0)"
	step 60 "load tiny2" "$BIN" load --socket-dir "$SVSOCK" --model "$WORK/tiny2" >/dev/null || check "serve: load tiny2" 0 "$(tail -n 3 "$WORK/serve.err")"
	T0=$(date +%s.%N)
	EV=$(step 300 "load model2" "$BIN" load --socket-dir "$SVSOCK" --model "$WORK/model2" --json) || EV=""
	EV_S=$(calc "$(date +%s.%N) - $T0" 3)
	# The order of eviction shows only where the checkpoint dwarfs a tiny
	# one and the GPU's allocation granularity (the fake driver's run
	# uses the tiny preset for both): there a copy must evict tiny1 (least
	# recently used), then the checkpoint (attached before tiny2 loaded).
	if ((FILE_BYTES > 64 * 1048576)); then
		check "serve: loading a second medium model evicts tiny1, then the medium one" \
			"$([[ $EV == *"\"evicted\":[\"$WORK/tiny1\",\"$MODEL\"]"* ]] && echo 1 || echo 0)" "${EV:0:300}"
	else
		check "serve: a copy of the checkpoint loads" "$([[ $EV == *'"state":"ready"'* ]] && echo 1 || echo 0)" "${EV:0:300}"
	fi
	step 120 "attach --digest (serve, model2)" "$BIN" attach --model "$WORK/model2" --socket-dir "$SVSOCK" --device "$DEVICE" --fallback=false --digest |
		grep -E '^[0-9a-f]{64}  ' | sed "s|$WORK/model2|$MODEL|" >"$WORK/serve2.digest" || true
	check "serve: the evicting model on the GPU equals the files" "$(cmp -s <(cut -d' ' -f1 "$WORK/serve2.digest") <(cut -d' ' -f1 "$WORK/disk.digest") && echo 1 || echo 0)"
	EVICTED=$(sed -n 's/.*"evicted":\(\[[^]]*\]\).*/\1/p' <<<"$EV")
	SERVE_LINE="$PRESET + 2 tiny resident; a copy of it loaded in $EV_S s, evicting ${EVICTED:-none} (budget $((FILE_BYTES + 8 * 1048576)) bytes)"
else
	check "serve on the GPU" 0 "$(tail -n 5 "$WORK/serve.err")"
fi
stop "$SV"

# 11. Figures.
RATIO_PAGEABLE=$(calc "100 * $PRELOAD / $PAGEABLE" 0)
RATIO_PINNED=$(calc "100 * $PRELOAD / $PINNED" 0)
say ""
say "figures ($PRESET: $TENSORS tensors, $(calc "$FILE_BYTES / 1e9") GB)"
say "  host-to-device, plain copy of the bytes:   $(calc "$PAGEABLE") GB/s (pageable memory)"
say "  host-to-device, pinned ceiling:            $(calc "$PINNED") GB/s"
say "  preload from page cache:                   $PRELOAD GB/s in $(calc "$LOAD_S" 3) s ($RATIO_PAGEABLE% of plain copy, $RATIO_PINNED% of pinned)"
say "  preload wall time, process start to ready: $WALL_S s ($(calc "$FILE_BYTES / $WALL_S / 1e9") GB/s; includes driver start-up)"
say "  attach (Go, zero_copy, median of 5):       $MEDIAN_MS ms ($(printf '%s ' "${ATTACH_MS[@]}")ms; driver start-up before it: $INIT_MS ms)"
say "  attach (Python, ctypes on libcuda):        $PY_LINE"
say "  attach (weightcache Python package):       $PKG_LINE"
say "  read-only mappings:                        ${READ_ONLY:-false}"
say "  publish into the GPU:                      $PUB_N tensors in $(calc "$PUB_S" 3) s; attach of the published layout $PUB_ATTACH_MS ms"
say "  TP 2 on GPUs:                              $TP_LINE"
say "  vLLM loader tier 2 restart on the GPU:     $T2_LINE"
say "  GPU rank killed and replaced:              $RESTART_LINE"
say "  --takeover on the GPU:                     $TAKEOVER_LINE"
say "  GPU ranks seeded from a peer (loopback):   $PEER_LINE"
say "  vLLM compile artifacts restored (GPU):     $RESTART_ART_LINE"
say "  vLLM switched in place (GPU):              $SWITCH_LINE"
say "  several models under a budget (serve):     $SERVE_LINE"
target "preload >= 70% of the pinned ceiling" "$(ge "$PRELOAD" "0.7 * $PINNED")" "$RATIO_PINNED%"
target "preload >= 80% of plain host-to-device copy" "$(ge "$PRELOAD" "0.8 * $PAGEABLE")" "$RATIO_PAGEABLE%"
target "attach of $TENSORS tensors < 50 ms" "$(ge 50 "$MEDIAN_MS")" "$MEDIAN_MS ms"
if [[ $FAILED == 1 ]]; then
	say "gpu-check: FAILED"
	exit 1
fi
if [[ $MISSED == 1 ]]; then
	say "gpu-check: checks passed, a target was missed"
	exit 3
fi
say "gpu-check: all checks and targets passed"
