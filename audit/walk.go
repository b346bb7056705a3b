package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// gcPercent is the GC target Run holds while it works. An audit makes much
// short-lived garbage (yaml.v3's trees most of it) against a live heap of
// a few MB, which the default target (100) collects many times a run; 400
// trades a little peak memory for much of the time, without which the
// audit misses its target against grep (docs/architecture.md, Measurements).
const gcPercent = 400

// ErrUnreadable is the category of a path named on the command line that
// cannot be read.
var ErrUnreadable = errors.New("unreadable path")

// maxFileSize bounds what is read: deploy files are small, and a large file
// of a deploy kind is generated data.
const maxFileSize = 8 << 20

// skipDirs are never descended into: version control and vendored code.
var skipDirs = map[string]bool{
	".git": true, ".hg": true, ".svn": true, "node_modules": true, "vendor": true,
	"third_party": true, ".venv": true, "venv": true, "site-packages": true,
	"__pycache__": true, ".tox": true, ".terraform": true, ".mypy_cache": true,
}

type kind uint8

const (
	kindNone kind = iota
	kindShell
	kindUnit
	kindDocker
	kindYAML
	kindJSON
	kindDotenv
	kindPython
	kindSniff // no extension: decided by a #! line
)

// templateExts are template files: the name under the extension says the
// kind (deployment.yaml.j2), else the content does (_helpers.tpl).
var templateExts = map[string]bool{".tpl": true, ".j2": true, ".jinja": true, ".jinja2": true, ".gotmpl": true, ".tmpl": true}

func isDockerfileName(base string) bool {
	for _, stem := range []string{"Dockerfile", "Containerfile", "dockerfile", "containerfile"} {
		if rest, ok := strings.CutPrefix(base, stem); ok && (rest == "" || strings.IndexByte(".-_", rest[0]) >= 0) {
			return true
		}
	}
	return strings.HasSuffix(base, ".dockerfile") || strings.HasSuffix(base, ".Dockerfile") || strings.HasSuffix(base, ".containerfile")
}

func kindOf(path string) kind {
	base := filepath.Base(path)
	if ext := filepath.Ext(base); templateExts[ext] {
		if k := kindOf(strings.TrimSuffix(base, ext)); k != kindNone {
			return k
		}
		return kindSniff
	}
	switch {
	case isDockerfileName(base):
		return kindDocker
	case base == ".env" || strings.HasPrefix(base, ".env."):
		return kindDotenv
	}
	switch filepath.Ext(base) {
	case ".sh", ".bash", ".zsh", ".ksh":
		return kindShell
	case ".service":
		return kindUnit
	case ".conf":
		if strings.HasSuffix(filepath.Dir(path), ".service.d") {
			return kindUnit // a drop-in
		}
	case ".yml", ".yaml":
		return kindYAML
	case ".json":
		return kindJSON
	case ".env":
		return kindDotenv
	case ".py":
		return kindPython
	case "":
		return kindSniff
	}
	return kindNone
}

// sniff decides a file's kind by its content: a #! line, or for a file
// without one, the first line that says what it is. The reason says why
// a file is skipped.
func sniff(src []byte) (kind, string) {
	if bytes.IndexByte(src[:min(len(src), 8192)], 0) >= 0 {
		return kindNone, "binary file"
	}
	if bytes.HasPrefix(src, []byte("#!")) {
		line, _, _ := bytes.Cut(src, []byte("\n"))
		switch {
		case bytes.Contains(line, []byte("python")):
			return kindPython, ""
		case bytes.Contains(line, []byte("sh")):
			return kindShell, ""
		}
		return kindNone, "its #! line names another interpreter: " + strings.TrimSpace(string(line[2:]))
	}
	rest := src
	for n := 0; len(rest) > 0 && n < 200; n++ {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		t := string(bytes.TrimSpace(line))
		if t == "" || t[0] == '#' || strings.HasPrefix(t, "{{") || strings.HasPrefix(t, "{%") {
			continue
		}
		first, _, _ := strings.Cut(t, " ")
		switch {
		case t == "[Unit]" || t == "[Service]" || t == "[Install]":
			return kindUnit, ""
		case strings.EqualFold(first, "FROM"):
			return kindDocker, ""
		case strings.HasPrefix(t, "apiVersion:") || strings.HasPrefix(t, "kind:") || strings.HasPrefix(t, "services:") || t == "---":
			return kindYAML, ""
		case first == "import" || first == "def" || first == "class" || (first == "from" && strings.Contains(t, " import ")):
			return kindPython, ""
		case shellStarts[first] || isPython(first) || strings.HasPrefix(first, "/") || strings.HasPrefix(first, "./"):
			return kindShell, ""
		}
		if name, _, ok := splitAssign(first); ok && isEnvName(name) {
			return kindShell, ""
		}
	}
	return kindNone, "no #! line, and no line says it is a script, unit, Dockerfile or YAML"
}

// shellStarts are words a line of a shell script starts with.
var shellStarts = map[string]bool{
	"vllm": true, "weightcache": true, "exec": true, "export": true, "set": true, "cd": true,
	"source": true, ".": true, "if": true, "for": true, "while": true, "echo": true, "docker": true,
	"podman": true, "env": true, "nohup": true, "sudo": true, "uvicorn": true, "sh": true, "bash": true,
	"unset": true, "trap": true, "wait": true, "kubectl": true, "case": true, "function": true,
}

type job struct {
	path  string
	kind  kind
	tmpl  bool // a template: its {{ }} and {% %} are blanked first
	named bool // named on the command line
}

// Skip is a file or folder the audit did not read, and why.
type Skip struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

type auditor struct {
	rs *RuleSet
	// roots are the scanned paths as given, and absolute, for resolving
	// environment files.
	roots, absRoots []string
	files           atomic.Int64
	parsed          atomic.Int64
	mu              sync.Mutex
	skipped         []Skip
}

func (a *auditor) skip(path, reason string) {
	a.mu.Lock()
	a.skipped = append(a.skipped, Skip{path, reason})
	a.mu.Unlock()
}

// Run audits paths (files or directories, walked recursively) with a
// bounded pool of workers, each reading a file once. A path that cannot be
// read is an error wrapping ErrUnreadable; anything unreadable found while
// walking is a finding instead. It raises the process's GC target for its
// duration (gcPercent) and puts it back when done.
func Run(ctx context.Context, paths []string, rs *RuleSet) (*Report, error) {
	defer debug.SetGCPercent(debug.SetGCPercent(gcPercent))
	a := &auditor{rs: rs}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnreadable, err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnreadable, err)
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUnreadable, err)
		}
		a.roots, a.absRoots = append(a.roots, p), append(a.absRoots, abs)
	}
	workers := runtime.GOMAXPROCS(0)
	b := &batcher{out: make(chan []job, 4*workers)}
	out := make([][]Finding, workers+1) // the last slot is the walker's
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var buf []byte
			for batch := range b.out {
				for _, j := range batch {
					var fs []Finding
					fs, buf = a.file(j, buf)
					out[w] = append(out[w], fs...)
				}
			}
		})
	}
	var err error
	for _, p := range paths {
		if err = a.walk(ctx, p, b, &out[workers]); err != nil {
			break
		}
	}
	b.close()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	var all []Finding
	for _, o := range out {
		all = append(all, o...)
	}
	slices.SortFunc(a.skipped, func(x, y Skip) int { return strings.Compare(x.Path, y.Path) })
	return &Report{Findings: sortFindings(all), Skipped: a.skipped, Files: int(a.files.Load()), Parsed: int(a.parsed.Load()), Rules: rs}, nil
}

// batcher hands files to the workers batchSize at a time: handing over
// each file alone costs more in goroutine wake-ups than reading it.
type batcher struct {
	out     chan []job
	pending []job
}

const batchSize = 32

func (b *batcher) add(j job) {
	if b.pending = append(b.pending, j); len(b.pending) == batchSize {
		b.out <- b.pending
		b.pending = make([]job, 0, batchSize)
	}
}

func (b *batcher) close() {
	if len(b.pending) > 0 {
		b.out <- b.pending
	}
	close(b.out)
}

func (a *auditor) walk(ctx context.Context, root string, b *batcher, diag *[]Finding) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == root {
				return fmt.Errorf("%w: %v", ErrUnreadable, err)
			}
			*diag = append(*diag, newFinding(path, ruleUnreadable, Pos{1, 1}, false, err.Error()))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if d.IsDir() {
			if path != root && skipDirs[d.Name()] {
				a.skip(path, "vendored, virtual-environment or version-control folder")
				return filepath.SkipDir
			}
			return nil
		}
		k := kindOf(path)
		named := path == root
		if named && k == kindNone {
			k = kindSniff // named on the command line: read it whatever its name
		}
		switch {
		case k == kindNone:
		case !d.Type().IsRegular():
			a.skip(path, "not a regular file")
		default:
			b.add(job{path: path, kind: k, tmpl: templateExts[filepath.Ext(path)], named: named})
		}
		return nil
	})
}

// file reads and audits one file into buf, which it returns for reuse:
// nothing a parser keeps refers to it.
func (a *auditor) file(j job, buf []byte) ([]Finding, []byte) {
	src, err := readInto(buf, j.path)
	if err != nil {
		return []Finding{newFinding(j.path, ruleUnreadable, Pos{1, 1}, false, err.Error())}, src
	}
	if j.kind == kindSniff {
		var why string
		if j.kind, why = sniff(src); j.kind == kindNone && j.named && why != "binary file" {
			j.kind = kindShell // named on the command line: read as a script
		}
		if j.kind == kindNone {
			a.skip(j.path, why)
			return nil, src
		}
	}
	if j.tmpl {
		src = blankTemplates(src)
	}
	a.files.Add(1)
	active, any := a.rs.pre.active(src)
	if !any {
		return nil, src
	}
	a.parsed.Add(1)
	return a.scan(j.path, j.kind, src, active), src
}

// pathError is os.PathError without importing the os file machinery into
// the read path.
type pathError struct {
	op, path string
	err      error
}

func (e *pathError) Error() string { return e.op + " " + e.path + ": " + e.err.Error() }
func (e *pathError) Unwrap() error { return e.err }

// factsPool keeps the facts slices of parsed files for the next file, so
// that they grow once per worker rather than once per file.
var factsPool = sync.Pool{New: func() any { return new(facts) }}

// scan parses one file and runs the rules; a parser panic is a finding
// about that file, not the end of the audit.
func (a *auditor) scan(path string, k kind, src []byte, active []bool) (out []Finding) {
	defer func() {
		if v := recover(); v != nil {
			out = []Finding{newFinding(path, ruleUnparsed, Pos{1, 1}, false, fmt.Sprintf("parser failed: %v", v))}
		}
	}()
	f := factsPool.Get().(*facts)
	defer factsPool.Put(f)
	f.reset()
	if err := parse(k, src, f); err != nil {
		p := Pos{1, 1}
		var pr *problem
		if errors.As(err, &pr) {
			p = pr.Pos
		}
		r := ruleUnparsed
		if isTemplate(src) {
			r = ruleUnparsedTemplate
		}
		return []Finding{newFinding(path, r, p, false, err.Error())}
	}
	s := &fileScan{rs: a.rs, path: path, facts: f, active: active}
	out = s.evaluate()
	for _, r := range f.EnvFiles {
		out = append(out, a.envFile(path, r)...)
	}
	return out
}

func parse(k kind, src []byte, f *facts) error {
	switch k {
	case kindShell, kindDotenv:
		f.addShell(lexShell(string(src), Pos{1, 1}, false), false, 0)
	case kindUnit:
		return parseUnit(string(src), f)
	case kindDocker:
		parseDockerfile(string(src), f)
	case kindYAML:
		return parseYAML(src, f)
	case kindJSON:
		return parseJSON(src, f)
	case kindPython:
		parsePython(string(src), f)
	}
	return nil
}

// envFile reports an EnvironmentFile= or env_file reference and audits the
// file it names when that resolves inside a scanned tree: as written, or
// with an absolute path taken relative to a scanned root (a repository
// that mirrors /etc).
func (a *auditor) envFile(from string, r ref) []Finding {
	var cands []string
	if filepath.IsAbs(r.Path) {
		for i, root := range a.roots {
			if rel, err := filepath.Rel(a.absRoots[i], r.Path); err == nil && !strings.HasPrefix(rel, "..") {
				cands = append(cands, filepath.Join(root, rel))
			}
			cands = append(cands, filepath.Join(root, r.Path))
		}
	} else {
		cands = append(cands, filepath.Join(filepath.Dir(from), r.Path))
	}
	for _, c := range cands {
		src, err := readInto(nil, c)
		if err != nil {
			continue
		}
		out := []Finding{newFinding(from, ruleEnvFile, r.Pos, false, fmt.Sprintf("%s, audited as %s", r.Path, c))}
		if active, any := a.rs.pre.active(src); any {
			out = append(out, a.scan(c, kindDotenv, src, active)...)
		}
		return out
	}
	return []Finding{newFinding(from, ruleEnvFile, r.Pos, false, r.Path+" is not in the scanned tree and was not audited")}
}
