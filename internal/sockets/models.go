package sockets

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
)

// A socket directory that `weightcache serve` manages holds several models:
// serve's control socket, and one directory per resident model under
// models/, named by ModelKey, each a socket directory of its own for that
// model's preload. A client finds its model's directory from the
// checkpoint it resolved, with one stat and no request: attach costs the
// same with one model resident or sixteen.

// ServePath is the control socket of the serve managing dir.
func ServePath(dir string) string { return filepath.Join(dir, "serve.ctl") }

// ModelsDir holds the resident models' socket directories.
func ModelsDir(dir string) string { return filepath.Join(dir, "models") }

// ModelKey names the checkpoint in directory ckpt (a resolved checkpoint's
// Dir) in a managed socket directory: a hash of its real path, short enough
// that the sockets below it keep their plain names. A layout an engine (or
// a trainer) publishes over that checkpoint is a model of its own, named
// by the engine and its version as well.
func ModelKey(ckpt, engine, engineVersion string) string {
	if real, err := filepath.EvalSymlinks(ckpt); err == nil {
		ckpt = real
	} else if abs, err := filepath.Abs(ckpt); err == nil {
		ckpt = abs
	}
	id := filepath.Clean(ckpt)
	if engine != "" {
		id += "\x00" + engine + "\x00" + engineVersion
	}
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:6])
}

// ModelDir is the socket directory of the checkpoint in directory ckpt (as
// published by engine at engineVersion, when engine is set) when serve
// manages dir (managed true; the model may not be resident), else dir
// itself.
func ModelDir(dir, ckpt, engine, engineVersion string) (sub string, managed bool) {
	st, err := os.Stat(ModelsDir(dir))
	if err != nil || !st.IsDir() {
		return dir, false
	}
	return filepath.Join(ModelsDir(dir), ModelKey(ckpt, engine, engineVersion)), true
}
