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
	if isTemplate(src) {
		src = blankTemplates(src)
	}
	w := &yamlWalker{f: f, src: src}
	docs, err := decodeYAML(src)
	if err != nil {
		return err
	}
	for _, d := range docs {
		w.document(d)
	}
	w.comments()
	return nil
}

// decodeYAML reads every document in src; yaml.v3 is the judge of what is
// malformed.
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

// isTemplate reports whether src holds template actions (Helm, Jinja).
func isTemplate(src []byte) bool {
	return bytes.Contains(src, []byte("{{")) || bytes.Contains(src, []byte("{%"))
}

// templateFill stands for a template action inside a line's text: a value
// the audit cannot know (image: repo:____ is not a known image).
const templateFill = '_'

// blankTemplates replaces template actions ({{ }} of Helm and Go, {% %}
// and {# #} of Jinja) so that the rest parses and keeps its positions: an
// action alone on its line becomes spaces, one inside text becomes
// templateFill bytes (image: repo:{{ .Tag }} must stay a plain scalar).
func blankTemplates(src []byte) []byte {
	out := bytes.Clone(src)
	for i := 0; i+1 < len(out); i++ {
		if out[i] != '{' || (out[i+1] != '{' && out[i+1] != '%' && out[i+1] != '#') {
			continue
		}
		closer := []byte{'}', '}'}
		if out[i+1] != '{' {
			closer[0] = out[i+1]
		}
		end := bytes.Index(out[i:], closer)
		if end < 0 {
			break
		}
		fill := byte(' ')
		if ls := bytes.LastIndexByte(out[:i], '\n') + 1; len(bytes.TrimSpace(out[ls:i])) > 0 {
			fill = templateFill
		}
		for j := i; j < i+end+2; j++ {
			if out[j] != '\n' {
				out[j] = fill
			}
		}
		i += end + 1
	}
	return out
}

// docKind is what a YAML document is, from its top-level keys: that
// decides whether a key: value pair is an engine setting.
type docKind uint8

const (
	docConfig  docKind = iota // a vLLM config file, Helm values: keys are settings
	docKube                   // a Kubernetes object: containers hold the settings
	docCompose                // a compose file: services hold the settings
)

type yamlWalker struct {
	f    *facts
	src  []byte
	kind docKind
	// lines is src split, made when a block scalar first needs it.
	lines [][]byte
}

func pos(n *yaml.Node) Pos { return Pos{n.Line, n.Column} }

func (w *yamlWalker) document(d *yaml.Node) {
	w.kind = docConfig
	if len(d.Content) == 1 && d.Content[0].Kind == yaml.MappingNode {
		root := d.Content[0]
		if mapValue(root, "apiVersion") != nil && mapValue(root, "kind") != nil {
			w.kind = docKube
		} else if s := mapValue(root, "services"); s != nil && s.Kind == yaml.MappingNode {
			w.kind = docCompose
			for i := 0; i+1 < len(root.Content); i += 2 {
				if root.Content[i].Value != "services" {
					w.node(root.Content[i+1])
					continue
				}
				for j := 0; j+1 < len(s.Content); j += 2 {
					if svc := s.Content[j+1]; svc.Kind == yaml.MappingNode {
						w.container(svc)
					}
				}
			}
			return
		}
	}
	w.node(d)
}

// mapValue is the value of key in mapping n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func (w *yamlWalker) node(n *yaml.Node) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			w.node(c)
		}
	case yaml.MappingNode:
		if w.kind == docKube && (mapValue(n, "image") != nil || mapValue(n, "args") != nil || mapValue(n, "command") != nil) {
			w.container(n)
			return
		}
		w.mapping(n)
	case yaml.SequenceNode:
		w.sequence(n)
	case yaml.ScalarNode:
		w.scalar(n)
	}
}

// mapping: in a config document, keys with scalar values become one
// --key=value command (a vLLM config file, Helm values). Anywhere, an
// upper-case key with a scalar value sets a variable (a ConfigMap read as
// the environment), env and environment are read as such, and env_file
// names a file read at run time.
func (w *yamlWalker) mapping(n *yaml.Node) {
	if name := mapValue(n, "name"); name != nil && isEnvName(name.Value) && (mapValue(n, "value") != nil || mapValue(n, "valueFrom") != nil) {
		w.env(&yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{n}}) // an env entry in a list of its own (Helm's extraEnv)
	}
	var cmd Command
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		switch key {
		case "env_file":
			w.envFiles(v)
		case "env", "environment":
			if v.Kind != yaml.ScalarNode {
				w.env(v)
				continue
			}
		}
		switch v.Kind {
		case yaml.ScalarNode:
			if isEnvName(key) {
				w.f.setEnv(key, v.Value, true, pos(k), false, -1)
			}
			if w.kind == docConfig {
				cmd.Words = append(cmd.Words, Word{Text: "--" + dashify(key) + "=" + v.Value, Pos: pos(k)})
			}
		case yaml.MappingNode, yaml.SequenceNode:
			if w.kind == docConfig && dashify(key) == loaderConfigFlag[2:] {
				cmd.Words = append(cmd.Words, Word{Text: "--" + dashify(key) + "=" + nodeJSON(v), Pos: pos(k)})
			}
		}
		w.node(v)
	}
	if len(cmd.Words) > 0 {
		cmd.recog = recog{prog: progVLLM, module: -1, script: -1}
		cmd.Scope = w.f.scope
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

// sequence: a list of scalars is an argument list when it runs vLLM, or,
// in a config document, when it is a list of flags (Helm's extraArgs).
func (w *yamlWalker) sequence(n *yaml.Node) {
	ws := make([]Word, 0, len(n.Content))
	for _, c := range n.Content {
		ws = append(ws, w.word(c))
		w.node(c)
	}
	if w.kind == docConfig && startsWithFlag(ws) {
		w.f.Commands = append(w.f.Commands, Command{Words: ws, recog: recog{prog: progVLLM, module: -1, script: -1}, Scope: w.f.scope})
		return
	}
	w.f.command(ws, false, 1)
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
	default:
		text, at := w.scalarText(n)
		w.f.literal(text, pos(n), at, false, false, 0)
	}
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
