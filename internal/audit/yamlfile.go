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
	if bytes.Contains(src, []byte("{{")) || bytes.Contains(src, []byte("{%")) {
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
		w.document(d)
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

var nodeSlabs slabPool[yaml.Node]

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

// container reads a Kubernetes container or a compose service as one
// scope: its command line (command or entrypoint, then args; or the
// image's own entrypoint when that is vLLM or not known) and its env.
func (w *yamlWalker) container(n *yaml.Node) {
	prev := w.f.newScope()
	defer func() { w.f.scope = prev }()
	var entry, args []Word
	image, hasEntry, hasArgs := "", false, false
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch key := k.Value; {
		case key == "image":
			image = v.Value
			if r := mapValue(v, "repository"); r != nil {
				image = r.Value
			}
		case key == "entrypoint" || (key == "command" && w.kind != docCompose):
			entry, hasEntry = w.argList(v), true
		case key == "args" || key == "command":
			args, hasArgs = w.argList(v), true
		case key == "env" || key == "environment":
			w.env(v)
		case key == "env_file":
			w.envFiles(v)
		default:
			w.node(v)
		}
	}
	r := recognise(args)
	switch image = strings.TrimSpace(image); {
	case hasEntry:
		w.f.command(append(entry, args...), false, 0)
	case !hasArgs:
	case r.prog != progNone || r.script >= 0 || r.module >= 0:
		w.f.command(args, false, 0)
	case strings.Trim(image, ":@") == "" || strings.Contains(image, string([]byte{templateFill, templateFill})) || isVLLMImage(image):
		// Not known (empty, or from a template) or vLLM's.
		w.f.Commands = append(w.f.Commands, Command{Words: args, recog: recog{prog: progVLLM, module: -1, script: -1}, Scope: w.f.scope})
	}
}

// argList reads a command or args value: a list, or a string split as a
// shell would (compose).
func (w *yamlWalker) argList(v *yaml.Node) []Word {
	switch v.Kind {
	case yaml.SequenceNode:
		ws := make([]Word, 0, len(v.Content))
		for _, c := range v.Content {
			ws = append(ws, w.word(c))
		}
		return ws
	case yaml.ScalarNode:
		text, at := w.scalarText(v)
		if v.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
			var line int
			text, line = w.blockText(v)
			at = Pos{line, 1}
		}
		return flatWords(nil, lexShell(text, at, v.Style == yaml.FoldedStyle))
	}
	return nil
}

// word is a list element as an argument; a block scalar keeps its text as
// written, indentation included, so that a script in it keeps its columns.
func (w *yamlWalker) word(c *yaml.Node) Word {
	if c.Kind != yaml.ScalarNode {
		return Word{Pos: pos(c), Opaque: true}
	}
	if c.Style == yaml.LiteralStyle || c.Style == yaml.FoldedStyle {
		text, start := w.blockText(c)
		return Word{Text: text, Pos: Pos{start, 1}}
	}
	quoted := c.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0
	if text, at := w.scalarText(c); text != c.Value {
		// Over several lines: a script in it keeps its lines.
		return Word{Text: text, Pos: at}
	}
	return Word{Text: c.Value, Pos: pos(c), Quoted: quoted}
}

// env reads a Kubernetes env list (name/value entries), a compose
// environment list (NAME=value, or NAME passed on) or map: every name
// there is set, whatever its value.
func (w *yamlWalker) env(v *yaml.Node) {
	switch v.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(v.Content); i += 2 {
			k, val := v.Content[i], v.Content[i+1]
			w.f.setEnv(k.Value, val.Value, val.Kind == yaml.ScalarNode, pos(k), false, -1)
		}
	case yaml.SequenceNode:
		for _, c := range v.Content {
			switch c.Kind {
			case yaml.ScalarNode:
				if name, value, ok := splitAssign(c.Value); ok {
					w.f.setEnv(name, value, true, pos(c), false, -1)
				} else if isIdent(c.Value) {
					w.f.setEnv(c.Value, "", false, pos(c), false, -1)
				}
			case yaml.MappingNode:
				if name := mapValue(c, "name"); name != nil && name.Kind == yaml.ScalarNode {
					val := mapValue(c, "value")
					hasVal := val != nil && val.Kind == yaml.ScalarNode
					value := ""
					if hasVal {
						value = val.Value
					}
					w.f.setEnv(name.Value, value, hasVal, pos(name), false, -1)
				}
			}
		}
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

// scalarText is a flow scalar's text and where it starts. One written over
// several lines is read from the source as written, so that a flag on its
// third line is placed there; YAML folds its line breaks to spaces, which
// a shell lexer treats alike.
func (w *yamlWalker) scalarText(n *yaml.Node) (string, Pos) {
	at := pos(n)
	quoted := n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0
	if quoted {
		at.Col++
	}
	if !strings.ContainsAny(n.Value, " \t") || n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return n.Value, at
	}
	if w.lines == nil {
		w.lines = bytes.Split(w.src, []byte("\n"))
	}
	if n.Line < 1 || n.Line > len(w.lines) {
		return n.Value, at
	}
	first := string(w.lines[n.Line-1])
	off := byteOffset(first, at.Col-1)
	if off < 0 || n.Line == len(w.lines) {
		return n.Value, at
	}
	rest := first[off:]
	if quoted {
		q := byte('"')
		if n.Style&yaml.SingleQuotedStyle != 0 {
			q = '\''
		}
		if end := quotedEnd(string(q)+rest, 0); end > 0 {
			return n.Value, at // closes on its first line
		}
	} else if strings.HasPrefix(n.Value, strings.TrimRight(rest, " ")) && len(strings.TrimRight(rest, " ")) == len(n.Value) {
		return n.Value, at
	}
	// Several lines: the source from the scalar to where its value ends.
	var b strings.Builder
	b.WriteString(rest)
	for l := n.Line; l < len(w.lines) && !folded(b.String(), n); l++ {
		b.WriteByte('\n')
		b.Write(w.lines[l])
	}
	text := b.String()
	if quoted {
		if q := strings.LastIndexAny(text, `"'`); q >= 0 {
			text = text[:q]
		}
	}
	return text, at
}

// folded reports whether text, as written, already holds all of n's words.
func folded(text string, n *yaml.Node) bool {
	return len(strings.Fields(text)) >= len(strings.Fields(n.Value))
}

// byteOffset is the byte offset of the col-th code point of s, or -1.
func byteOffset(s string, col int) int {
	for i := range s {
		if col == 0 {
			return i
		}
		col--
	}
	if col == 0 {
		return len(s)
	}
	return -1
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
