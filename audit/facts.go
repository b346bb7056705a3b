package audit

import (
	"encoding/json"
	"strings"
)

// maxNesting bounds how deep a string inside a string (sh -c "...", a
// Python string holding a command line) is parsed again.
const maxNesting = 2

// setEnv records a variable given a value or passed on, to command cmd of
// the current scope (-1: every command in it).
func (f *facts) setEnv(name, value string, hasValue bool, p Pos, comment bool, cmd int) {
	f.Env = append(f.Env, EnvUse{Name: name, Value: value, HasValue: hasValue, Pos: p, Comment: comment, Set: true, Scope: f.scope, Cmd: cmd})
}

// mentionEnv records a read or other mention of a variable.
func (f *facts) mentionEnv(name string, p Pos, comment bool) {
	f.Env = append(f.Env, EnvUse{Name: name, Pos: p, Comment: comment, Scope: f.scope, Cmd: -1})
}

// literal looks inside a string taken from a data file or a program: it may
// be a module path, a JSON request body or a whole command line, which
// counts only if recognise knows its program. Whole-string facts are placed
// at the literal (at, its opening quote); what is inside it at its
// content, which starts at content. fold reads line breaks as blanks: the
// string is one argument list (shlex.split), not a script.
func (f *facts) literal(s string, at, content Pos, comment, fold bool, depth int) {
	if isDotted(s) {
		f.Modules = append(f.Modules, Mention{Name: s, Pos: at, Comment: comment})
		return
	}
	if strings.HasPrefix(strings.TrimSpace(s), "{") {
		f.jsonKeys(s, content, comment)
		return
	}
	if depth < maxNesting && strings.ContainsAny(s, " \t\n") {
		f.addShell(lexShell(s, content, fold), comment, depth+1)
	}
}

// isDotted reports whether s looks like a module path such as a.b.c.
func isDotted(s string) bool {
	if !strings.Contains(s, ".") {
		return false
	}
	for part := range strings.SplitSeq(s, ".") {
		if !isIdent(part) {
			return false
		}
	}
	return true
}

// jsonKeys records every object key of a JSON document, at its place in s.
// Text that is not JSON is ignored: it was only a guess.
func (f *facts) jsonKeys(s string, p Pos, comment bool) {
	dec := json.NewDecoder(strings.NewReader(s))
	depthObj := []bool{} // per open container: is it an object expecting a key?
	expectKey := false
	for {
		tok, err := dec.Token()
		if err != nil {
			return
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				depthObj = append(depthObj, true)
				expectKey = true
			case '[':
				depthObj = append(depthObj, false)
				expectKey = false
			default:
				depthObj = depthObj[:len(depthObj)-1]
				expectKey = len(depthObj) > 0 && depthObj[len(depthObj)-1]
			}
			continue
		case string:
			if expectKey {
				end := int(dec.InputOffset())
				start := strings.LastIndex(s[:end], `"`+v+`"`)
				if start < 0 {
					start = 0
				}
				f.Keys = append(f.Keys, Mention{Name: v, Pos: advance(p, s[:start]), Comment: comment})
				expectKey = false
				continue
			}
		}
		// A value ends; inside an object the next string is a key again.
		expectKey = len(depthObj) > 0 && depthObj[len(depthObj)-1]
	}
}

// advance returns the position just after text that starts at p.
func advance(p Pos, text string) Pos {
	for i := 0; i < len(text); i++ {
		p = p.step(text[i])
	}
	return p
}
