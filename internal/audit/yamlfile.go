package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// parseYAML reads compose, Kubernetes and Helm files (and JSON, which is
// YAML too). It does not need to know which: compose environment maps,
// Kubernetes env name/value pairs, args and command lists and command
// strings each have a shape the walker recognises wherever they are.
func parseYAML(src []byte, f *facts) error {
	if bytes.Contains(src, []byte("{{")) {
		src = blankTemplates(src)
	}
	w := &yamlWalker{f: f, src: src}
	slab := nodeSlabs.get(512)
	defer nodeSlabs.put(slab) // after the walk, the last user of the tree
	docs, ok := fastYAML(src, slab)
	if !ok {
		var err error
		if docs, err = decodeYAML(src); err != nil {
			return err
		}
	}
	for _, d := range docs {
		w.node(d)
	}
	w.comments()
	return nil
}

// decodeYAML is the full YAML parser, for what fastYAML leaves to it.
func decodeYAML(src []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var docs []*yaml.Node
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, yamlProblem(err)
		}
		docs = append(docs, &doc)
	}
}

// yamlProblem turns "yaml: line 7: did not find expected key" into a
// problem placed on line 7.
func yamlProblem(err error) *problem {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	p := &problem{Pos: Pos{1, 1}, Msg: "malformed YAML: " + msg}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				p.Pos.Line = n
			}
		}
	}
	return p
}

// blankTemplates replaces Helm template actions with spaces of the same
// length, so that the rest parses as YAML and keeps its positions.
func blankTemplates(src []byte) []byte {
	out := bytes.Clone(src)
	for i := 0; i+1 < len(out); i++ {
		if out[i] != '{' || out[i+1] != '{' {
			continue
		}
		end := bytes.Index(out[i:], []byte("}}"))
		if end < 0 {
			break
		}
		for j := i; j < i+end+2; j++ {
			if out[j] != '\n' {
				out[j] = ' '
			}
		}
		i += end + 1
	}
	return out
}

var nodeSlabs slabPool[yaml.Node]

type yamlWalker struct {
	f   *facts
	src []byte
	// lines is src split, made when a block scalar first needs it.
	lines [][]byte
}

func pos(n *yaml.Node) Pos { return Pos{n.Line, n.Column} }

func (w *yamlWalker) node(n *yaml.Node) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			w.node(c)
		}
	case yaml.MappingNode:
		w.mapping(n)
	case yaml.SequenceNode:
		w.sequence(n)
	case yaml.ScalarNode:
		w.scalar(n)
	}
}

// mapping: keys with scalar values become one --key=value command (a vLLM
// config file), upper-case keys are environment (compose), name/value pairs
// are environment (Kubernetes), and env_file names a file read at run time.
func (w *yamlWalker) mapping(n *yaml.Node) {
	var cmd Command
	var envName, envValue *yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		if key == "env_file" {
			w.envFiles(v)
		}
		switch v.Kind {
		case yaml.ScalarNode:
			if isEnvName(key) {
				w.f.env(key, v.Value, true, pos(k), false)
			}
			cmd.Words = append(cmd.Words, Word{Text: "--" + dashify(key) + "=" + v.Value, Pos: pos(k)})
			switch key {
			case "name":
				envName = v
			case "value":
				envValue = v
			}
		case yaml.MappingNode, yaml.SequenceNode:
			if dashify(key) == loaderConfigFlag[2:] {
				cmd.Words = append(cmd.Words, Word{Text: "--" + dashify(key) + "=" + nodeJSON(v), Pos: pos(k)})
			}
		}
		w.node(v)
	}
	if envName != nil && isEnvName(envName.Value) {
		if envValue != nil {
			w.f.env(envName.Value, envValue.Value, true, pos(envName), false)
		} else {
			w.f.env(envName.Value, "", false, pos(envName), false)
		}
	}
	if len(cmd.Words) > 0 {
		w.f.Commands = append(w.f.Commands, cmd)
	}
}

// nodeJSON is a YAML value written as JSON, for flags whose value is JSON.
func nodeJSON(n *yaml.Node) string {
	var v any
	if err := n.Decode(&v); err != nil {
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

func (w *yamlWalker) envFiles(v *yaml.Node) {
	add := func(n *yaml.Node) {
		if n.Kind == yaml.ScalarNode && n.Value != "" {
			w.f.EnvFiles = append(w.f.EnvFiles, ref{Path: n.Value, Pos: pos(n)})
		}
	}
	add(v)
	for _, c := range v.Content {
		add(c)
		if c.Kind == yaml.MappingNode { // compose's long form: {path: x}
			for i := 0; i+1 < len(c.Content); i += 2 {
				if c.Content[i].Value == "path" {
					add(c.Content[i+1])
				}
			}
		}
	}
}

// sequence: a list of scalars is an argument list (args, command,
// entrypoint, a Helm extraArgs).
func (w *yamlWalker) sequence(n *yaml.Node) {
	var cmd Command
	for _, c := range n.Content {
		if c.Kind == yaml.ScalarNode {
			cmd.Words = append(cmd.Words, Word{Text: c.Value, Pos: pos(c)})
		} else {
			cmd.Words = append(cmd.Words, Word{Pos: pos(c), Opaque: true})
		}
		w.node(c)
	}
	if len(cmd.Words) > 0 {
		w.f.Commands = append(w.f.Commands, cmd)
	}
}

// scalar looks inside every scalar, numbers and booleans included: none of
// them can match, and resolving tags costs more than looking.
func (w *yamlWalker) scalar(n *yaml.Node) {
	switch n.Style {
	case yaml.LiteralStyle, yaml.FoldedStyle:
		text, start := w.blockText(n)
		if strings.HasPrefix(strings.TrimSpace(text), "{") {
			w.f.jsonKeys(text, Pos{start, 1}, false)
			return
		}
		w.f.addShell(lexShell(text, Pos{start, 1}, n.Style == yaml.FoldedStyle), false, 1)
	case yaml.DoubleQuotedStyle, yaml.SingleQuotedStyle:
		w.f.scanLiteral(n.Value, pos(n), Pos{n.Line, n.Column + 1}, false, 0)
	default:
		w.f.scanLiteral(n.Value, pos(n), pos(n), false, 0)
	}
}

// blockText is a block scalar's text as it stands in the file, indentation
// included, so that shell words keep their real columns.
func (w *yamlWalker) blockText(n *yaml.Node) (string, int) {
	if w.lines == nil {
		w.lines = bytes.Split(w.src, []byte("\n"))
	}
	first := n.Line // 1-based line of the indicator; content starts below
	indent := -1
	end := first
	for i := first; i < len(w.lines); i++ {
		line := w.lines[i]
		trimmed := bytes.TrimLeft(line, " ")
		if len(bytes.TrimSpace(line)) == 0 {
			end = i + 1
			continue
		}
		ind := len(line) - len(trimmed)
		if indent < 0 {
			indent = ind
		}
		if ind < indent {
			break
		}
		end = i + 1
	}
	if end <= first {
		return "", first + 1
	}
	return string(bytes.Join(w.lines[first:end], []byte("\n"))), first + 1
}

// comments finds YAML comments line by line: a # at the start or after a
// blank, outside quotes that open a value.
func (w *yamlWalker) comments() {
	rest := w.src
	for n := 1; len(rest) > 0; n++ {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if c := commentStart(line); c >= 0 {
			p := advance(Pos{n, 1}, string(line[:c+1]))
			w.f.addComment(string(line[c+1:]), p, 0)
		}
	}
}

func commentStart(line []byte) int {
	var quote byte
	for i, c := range line {
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return i
		case (c == '"' || c == '\'') && (i == 0 || strings.IndexByte(" :[{,-", line[i-1]) >= 0):
			quote = c
		}
	}
	return -1
}

// parseJSON reads a JSON file for request keys.
func parseJSON(src []byte, f *facts) error {
	var v any
	if err := json.Unmarshal(src, &v); err != nil {
		p := &problem{Pos: Pos{1, 1}, Msg: "malformed JSON: " + err.Error()}
		var se *json.SyntaxError
		if errors.As(err, &se) && int(se.Offset) <= len(src) {
			p.Pos = advance(Pos{1, 1}, string(src[:se.Offset]))
		}
		return p
	}
	f.jsonKeys(string(src), Pos{1, 1}, false)
	return nil
}
