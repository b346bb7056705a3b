GO ?= go
BIN := bin/weightcache
export CGO_ENABLED ?= 0

.PHONY: build test demo bench fuzz deps clean

build:
	$(GO) build -o $(BIN) ./cmd/weightcache

# Race detection needs cgo; the product itself builds without it.
test: build
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 9m ./...

demo: build
	./$(BIN) demo

bench: build
	$(GO) test -run '^$$' -bench . -benchtime 3x ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseHeader -fuzztime 30s ./internal/safetensors

clean:
	rm -rf bin
