package audit

import (
	"encoding/json"
	"strings"
)

// maxNesting bounds how deep a string inside a string (sh -c "...", a
// Python string holding a command line) is parsed again.
const maxNesting = 2

func (f *facts) env(name, value string, hasValue bool, p Pos, comment bool) {
	f.Env = append(f.Env, EnvUse{Name: name, Value: value, HasValue: hasValue, Pos: p, Comment: comment})
}

// scanLiteral looks inside a literal string taken from a data file or a
// program: it may be an environment name, NAME=value, a module path, a JSON
// request body or a whole command line. Whole-string facts are placed at
// the literal (at, its opening quote, as for the same string seen as an
// argument); what is inside it at its content, which starts at content.
func (f *facts) scanLiteral(s string, at, content Pos, comment bool, depth int) {
	if isEnvName(s) {
		f.env(s, "", false, at, comment)
		return
	}
	if name, value, ok := splitAssign(s); ok && isEnvName(name) {
		f.env(name, value, true, at, comment)
	}
	if isDotted(s) {
		f.Modules = append(f.Modules, Mention{Name: s, Pos: at, Comment: comment})
		return
	}
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "{") {
		f.jsonKeys(s, content, comment)
		return
	}
	if depth < maxNesting && strings.ContainsAny(s, " \t\n") {
		f.addShell(lexShell(s, content, false), comment, depth+1)
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

// addShell turns lexed shell text into commands, environment uses and
// comment findings. It consumes res: its words go back for reuse.
func (f *facts) addShell(res shResult, comment bool, depth int) {
	vars := shellVars(res.cmds)
	for _, ws := range res.cmds {
		// The command's words first, as a window on the file's word
		// array; strings inside them add commands of their own after.
		start := len(f.words)
		for j := range ws {
			text, unresolved := expand(&ws[j], vars)
			f.words = append(f.words, Word{Text: text, Pos: ws[j].pos, Opaque: unresolved})
		}
		cmd := Command{Comment: comment, Words: f.words[start:len(f.words):len(f.words)]}
		f.Commands = append(f.Commands, cmd)
		for j := range ws {
			w, text := &ws[j], cmd.Words[j].Text
			f.shellWordEnv(ws, j, text, comment)
			if w.quoted && depth < maxNesting && len(text) > 0 {
				f.scanLiteral(text, w.pos, contentPos(w), comment, depth)
			}
		}
	}
	for _, c := range res.comments {
		f.addComment(c.text[1:], advance(c.pos, "#"), depth)
	}
	wordSlabs.put(res.words)
}

// contentPos is where a quoted word's content starts, when the quote leads.
func contentPos(w *shWord) Pos {
	if w.lead == '"' || w.lead == '\'' {
		return Pos{w.pos.Line, w.pos.Col + 1}
	}
	return w.pos
}

// envKeywords take bare variable names as arguments.
var envKeywords = map[string]bool{
	"export": true, "unset": true, "readonly": true, "declare": true,
	"local": true, "typeset": true, "-e": true, "--env": true,
}

// shellWordEnv records what word j of a command does to the environment:
// NAME=value anywhere (assignments, env, docker -e), bare names after
// export and friends, and $NAME references.
func (f *facts) shellWordEnv(ws []shWord, j int, text string, comment bool) {
	w := &ws[j]
	for _, r := range w.refs {
		f.env(r.name, "", false, r.pos, comment)
	}
	if w.lead != '"' && w.lead != '\'' {
		if name, value, ok := splitAssign(text); ok {
			f.env(name, value, true, w.pos, comment)
			return
		}
	}
	if isEnvName(text) && j > 0 && envKeywords[prevKeyword(ws, j)] {
		f.env(text, "", false, w.pos, comment)
	}
}

// prevKeyword is the nearest earlier word that is not an option such as -x,
// so that "declare -x NAME" and "export A B" count.
func prevKeyword(ws []shWord, j int) string {
	for k := j - 1; k >= 0; k-- {
		t := ws[k].text
		if envKeywords[t] {
			return t
		}
		if !strings.HasPrefix(t, "-") && !isEnvName(t) {
			return t
		}
	}
	return ""
}

// shellVars collects NAME=value assignments made as commands of their own
// (or by export), so that "--master-port $PORT" can be compared. A name
// assigned two different values is left unexpanded.
func shellVars(cmds [][]shWord) map[string]string {
	var vars map[string]string
	for _, ws := range cmds {
		start := 0
		if len(ws) > 0 && (ws[0].text == "export" || ws[0].text == "readonly" || ws[0].text == "declare" || ws[0].text == "local") {
			start = 1
		}
		for _, w := range ws[start:] {
			name, value, ok := splitAssign(w.text)
			if !ok || w.lead == '"' || w.lead == '\'' {
				break
			}
			if len(w.refs) > 0 {
				value = "" // self-referential or derived: not a literal
			}
			if vars == nil {
				vars = map[string]string{}
			}
			if old, seen := vars[name]; seen && old != value {
				value = ""
			}
			vars[name] = value
		}
	}
	return vars
}

// expand replaces $NAME references whose value the file assigns, and
// ${NAME:-def} defaults for names it does not; unresolved says a reference
// is left, so the text is not the value the program will see.
func expand(w *shWord, vars map[string]string) (text string, unresolved bool) {
	if len(w.refs) == 0 {
		return w.text, false
	}
	var b strings.Builder
	last := 0
	for _, r := range w.refs {
		v, ok := vars[r.name]
		if ok && v == "" {
			ok = false
		}
		if !ok && r.hasDef {
			v, ok = r.def, true
		}
		if !ok {
			unresolved = true
			continue
		}
		b.WriteString(w.text[last:r.start])
		b.WriteString(v)
		last = r.end
	}
	b.WriteString(w.text[last:])
	return b.String(), unresolved
}

// trimPunct strips prose punctuation from a word in a comment.
func trimPunct(s string) string { return strings.Trim(s, "`'\".,:;()[]{}<>*!?") }

// addComment looks for the same things in a comment as in code, so that a
// commented-out flag or a note about a variable is reported as such.
func (f *facts) addComment(text string, p Pos, depth int) {
	res := lexShell(text, p, false)
	for _, ws := range res.cmds {
		var kwargs Command
		for _, w := range ws {
			t := trimPunct(w.text)
			if name, value, ok := splitAssign(t); ok && !isEnvName(name) {
				// A commented-out Python call: quantization="fp8",
				kwargs.Words = append(kwargs.Words, Word{Text: "--" + dashify(name) + "=" + value, Pos: w.pos})
			}
			switch {
			case isEnvName(t):
				f.env(t, "", false, w.pos, true)
			case isDotted(t):
				f.Modules = append(f.Modules, Mention{Name: t, Pos: w.pos, Comment: true})
			case isIdent(t):
				f.Keys = append(f.Keys, Mention{Name: t, Pos: w.pos, Comment: true})
			}
		}
		if len(kwargs.Words) > 0 {
			kwargs.Comment = true
			f.Commands = append(f.Commands, kwargs)
		}
	}
	f.addShell(res, true, depth+1)
}
