package audit

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

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
