GO ?= go
BIN := bin/weightcache
# Debian's python3-torch and python3-pytest live in the system interpreter.
PYTHON ?= /usr/bin/python3
export CGO_ENABLED ?= 0

.PHONY: build test test-python python-deps demo bench bench-python bench-scale fuzz deps clean

build:
	$(GO) build -o $(BIN) ./cmd/weightcache

# Race detection needs cgo; the product itself builds without it.
test: build
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 9m ./...
	$(MAKE) test-python

# Installs Debian's torch and pytest when they are missing (root and apt).
python-deps:
	@$(PYTHON) -c 'import torch, pytest' 2>/dev/null || { \
		[ "$$(id -u)" = 0 ] || { echo "python3-torch and python3-pytest are missing: apt-get install them as root" >&2; exit 1; }; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch python3-pytest; }

test-python: build python-deps
	WEIGHTCACHE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q -p no:cacheprovider python/tests

bench-python: build python-deps
	$(PYTHON) python/bench_attach.py --bin $(BIN)

demo: build
	./$(BIN) demo

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

# Attach at 1k, 10k and 100k tensors from Go and Python; preload against cp
# and the preload tree's private memory (TP 1 and TP 4) at each size.
bench-scale: build python-deps
	$(GO) test -run '^$$' -bench AttachScale -benchtime 20x ./internal/commands/
	$(PYTHON) python/bench_scale.py --bin $(BIN)

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseHeader -fuzztime 30s ./internal/safetensors

clean:
	rm -rf bin
