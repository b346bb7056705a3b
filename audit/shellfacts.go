package audit

import "strings"

// shellScan is one shell text being turned into facts: the literal values
// of its variables, and those whose value is a list of flags that a
// command line takes in with $NAME (VLLM_ARGS="--quantization fp8").
type shellScan struct {
	f       *facts
	comment bool
	depth   int
	vars    map[string]string
	argVars map[string]*argVar
}

type argVar struct {
	words []Word
	// used: $NAME stands unquoted on some command line; engine: on a vLLM one.
	used, engine bool
}

// addShell turns lexed shell text into commands, environment settings and
// mentions, and comment findings. It consumes res: its words go back for
// reuse.
func (f *facts) addShell(res shResult, comment bool, depth int) {
	s := &shellScan{f: f, comment: comment, depth: depth, vars: shellVars(res.cmds)}
	for _, ws := range res.cmds {
		s.assignedArgs(ws)
	}
	for k := 0; k < len(res.cmds); k++ {
		if end := s.array(res, k); end > k {
			k = end
			continue
		}
		s.command(res.cmds[k])
	}
	for _, h := range res.heredocs {
		s.heredoc(res.cmds, h)
	}
	// A list of flags no line of this text uses ends up on one elsewhere
	// (an env file read by a unit or compose): it is the engine's.
	for _, av := range s.argVars {
		if !av.used {
			f.Commands = append(f.Commands, Command{Words: av.words, Comment: comment, recog: recog{prog: progVLLM, module: -1, script: -1}, Scope: f.scope})
		}
	}
	for _, c := range res.comments {
		f.addComment(c.text[1:], advance(c.pos, "#"), depth)
	}
	wordSlabs.put(res.words)
}

// flatWords appends the words of every command of res to ws, as one
// argument list (the value of ARGS="--a 1 --b 2"), and consumes res.
func flatWords(ws []Word, res shResult) []Word {
	for _, cmd := range res.cmds {
		ws = appendWords(ws, cmd)
	}
	wordSlabs.put(res.words)
	return ws
}

func appendWords(ws []Word, cmd []shWord) []Word {
	for j := range cmd {
		ws = append(ws, Word{Text: cmd[j].text, Pos: cmd[j].pos, Quoted: cmd[j].quoted})
	}
	return ws
}

// declarers set variables named as their operands.
var declarers = map[string]bool{"export": true, "readonly": true, "declare": true, "typeset": true, "local": true}

// assignments returns the operands of a command that only assigns: NAME=v
// words, or export and friends with their options left out.
func assignments(ws []shWord) ([]shWord, string) {
	if len(ws) > 0 && declarers[ws[0].text] {
		k := 1
		for k < len(ws) && strings.HasPrefix(ws[k].text, "-") {
			k++
		}
		return ws[k:], ws[0].text
	}
	for _, w := range ws {
		if _, _, ok := splitAssign(w.text); !ok || w.lead == '"' || w.lead == '\'' {
			return nil, ""
		}
	}
	return ws, ""
}

// valueOf lexes the value of an assignment word in place: the first flag
// of X="--quantization fp8 --port 1" stands where it is written.
func valueOf(w *shWord, name string) (shResult, bool) {
	raw := w.raw
	if len(raw) <= len(name)+1 {
		return shResult{}, false
	}
	at := advance(w.pos, raw[:len(name)+1])
	value := w.text[len(name)+1:]
	if q := raw[len(name)+1]; q == '"' || q == '\'' {
		at.Col++
	}
	if !strings.ContainsAny(value, " \t\n") || strings.HasPrefix(strings.TrimSpace(value), "{") {
		return shResult{}, false
	}
	return lexShell(value, at, false), true
}

// array reads a bash array assignment, NAME=( words ) or NAME+=( words ),
// which the lexer splits at its parentheses into NAME= and the commands up
// to the next ")". A list of flags is recorded like ARGS="..."; the index
// of the last command it took is returned, or k when cmds[k] is not one.
func (s *shellScan) array(res shResult, k int) int {
	ws := res.cmds[k]
	if len(ws) != 1 || ws[0].quoted || !strings.HasSuffix(ws[0].raw, "=") {
		return k
	}
	name := strings.TrimSuffix(strings.TrimSuffix(ws[0].raw, "="), "+")
	if !isIdent(name) {
		return k
	}
	end := k
	for _, c := range res.closes {
		if c > k+1 {
			end = c - 1
			break
		}
	}
	if end == k {
		return k
	}
	var words []Word
	for _, cmd := range res.cmds[k+1 : end+1] {
		words = appendWords(words, cmd)
	}
	s.f.setEnv(name, "", false, ws[0].pos, s.comment, -1)
	if startsWithFlag(words) {
		if s.argVars == nil {
			s.argVars = map[string]*argVar{}
		}
		if av := s.argVars[name]; av != nil { // ARGS+=( ... )
			av.words = append(av.words, words...)
		} else {
			s.argVars[name] = &argVar{words: words}
		}
	}
	return end
}

// assignedArgs records variables whose value is a list of flags.
func (s *shellScan) assignedArgs(ws []shWord) {
	ops, _ := assignments(ws)
	for k := range ops {
		name, _, ok := splitAssign(ops[k].text)
		if !ok {
			continue
		}
		res, ok := valueOf(&ops[k], name)
		if !ok || len(res.cmds) == 0 {
			continue
		}
		if words := flatWords(nil, res); startsWithFlag(words) {
			if s.argVars == nil {
				s.argVars = map[string]*argVar{}
			}
			s.argVars[name] = &argVar{words: words}
		}
	}
}

func (s *shellScan) command(ws []shWord) {
	f := s.f
	for j := range ws {
		for _, r := range ws[j].refs {
			f.mentionEnv(r.name, r.pos, s.comment)
		}
	}
	if ops, kw := assignments(ws); len(ops) > 0 || kw != "" {
		s.assign(ops, kw)
		return
	}
	if ws[0].text == "unset" {
		for _, w := range ws[1:] {
			if isEnvName(w.text) {
				f.mentionEnv(w.text, w.pos, s.comment)
			}
		}
		return
	}
	// The command's words as a window on the file's word array, with
	// $ARGS lists spliced in where they stand unquoted.
	start := len(f.words)
	var spliced []*argVar
	for j := range ws {
		w := &ws[j]
		if av := s.argVars[bareRef(w)]; av != nil {
			av.used = true
			spliced = append(spliced, av)
			f.words = append(f.words, av.words...)
			continue
		}
		text, unresolved := expand(w, s.vars)
		f.words = append(f.words, Word{Text: text, Pos: w.pos, Opaque: unresolved, Quoted: w.quoted})
		if w.quoted && strings.HasPrefix(strings.TrimSpace(text), "{") {
			f.jsonKeys(text, contentPos(w), s.comment) // curl -d '{...}'
		}
	}
	words := f.words[start:len(f.words):len(f.words)]
	for _, av := range s.argVars {
		// "$ARGS" or ${ARGS} inside another word uses it too, as one word.
		if !av.used && quotedUse(ws, av, s.argVars) {
			av.used = true
		}
	}
	if f.command(words, s.comment, s.depth) == progVLLM {
		for _, av := range spliced {
			av.engine = true
		}
	}
}

// quotedUse reports whether a word other than a bare $NAME refers to av.
func quotedUse(ws []shWord, av *argVar, all map[string]*argVar) bool {
	for j := range ws {
		for _, r := range ws[j].refs {
			if all[r.name] == av {
				return true
			}
		}
	}
	return false
}

// bareRef is NAME when the word is an unquoted $NAME or ${NAME}, which
// the shell splits into words, or an array's "${NAME[@]}", quoted or not.
func bareRef(w *shWord) string {
	if len(w.refs) != 1 {
		return ""
	}
	r := w.refs[0]
	if r.start != 0 || r.end != len(w.text) || r.hasDef {
		return ""
	}
	if t := w.text; strings.HasSuffix(t, "[@]}") || strings.HasSuffix(t, "[*]}") {
		return r.name
	}
	if w.quoted {
		return ""
	}
	return r.name
}

// assign records NAME=value operands and exported names as set, and a
// value that is itself a vLLM command line as a command.
func (s *shellScan) assign(ops []shWord, kw string) {
	f := s.f
	for k := range ops {
		w := &ops[k]
		name, value, ok := splitAssign(w.text)
		if !ok {
			if kw != "local" && isEnvName(w.text) {
				f.setEnv(w.text, "", false, w.pos, s.comment, -1)
			}
			continue
		}
		f.setEnv(name, value, true, w.pos, s.comment, -1)
		if s.argVars[name] != nil || s.depth >= maxNesting {
			continue
		}
		if res, ok := valueOf(w, name); ok {
			// CMD="vllm serve m --quantization fp8": run later by $CMD or eval.
			s.f.addShell(res, s.comment, s.depth+1)
		}
	}
}

// command records a recognised command line and the variables it passes,
// and audits the script it runs (sh -c, eval). It returns the program.
func (f *facts) command(ws []Word, comment bool, depth int) prog {
	r := recognise(ws)
	if comment && r.prog == progNone && r.module < 0 {
		// Prose or a fragment in a comment ("removed: --flag"): its
		// flags are reported as notes.
		for j := range ws {
			if strings.HasPrefix(ws[j].Text, "--") {
				r.prog, r.args = progVLLM, j
				break
			}
		}
	}
	idx := len(f.Commands)
	for _, k := range r.env {
		if name, value, ok := splitAssign(strings.TrimPrefix(strings.TrimPrefix(ws[k].Text, "--env="), "-e=")); ok {
			f.setEnv(name, value, true, ws[k].Pos, comment, idx)
		} else if isEnvName(ws[k].Text) {
			f.setEnv(ws[k].Text, "", false, ws[k].Pos, comment, idx) // docker -e NAME passes it on
		}
	}
	for _, k := range r.envFiles {
		if !comment {
			f.EnvFiles = append(f.EnvFiles, ref{Path: ws[k].Text, Pos: ws[k].Pos})
		}
	}
	if r.prog != progNone || r.module >= 0 {
		f.Commands = append(f.Commands, Command{Words: ws, Comment: comment, recog: r, Scope: f.scope})
	}
	if r.script >= 0 && depth < maxNesting {
		w := ws[r.script]
		at := w.Pos
		if w.Quoted {
			at.Col++
		}
		f.addShell(lexShell(w.Text, at, false), comment, depth+1)
	}
	return r.prog
}

// contentPos is where a quoted word's content starts, when the quote leads.
func contentPos(w *shWord) Pos {
	if w.lead == '"' || w.lead == '\'' {
		return Pos{w.pos.Line, w.pos.Col + 1}
	}
	return w.pos
}

// shellVars collects NAME=value assignments made as commands of their own
// (or by export), so that "--master-port $PORT" can be compared. A name
// assigned two different values is left unexpanded.
func shellVars(cmds [][]shWord) map[string]string {
	var vars map[string]string
	for _, ws := range cmds {
		ops, _ := assignments(ws)
		for _, w := range ops {
			name, value, ok := splitAssign(w.text)
			if !ok {
				continue
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
// commented-out flag or a note about a variable is reported, as a note.
func (f *facts) addComment(text string, p Pos, depth int) {
	res := lexShell(text, p, false)
	for _, ws := range res.cmds {
		var kwargs []Word
		for _, w := range ws {
			t := trimPunct(w.text)
			if name, value, ok := splitAssign(t); ok && !isEnvName(name) {
				// A commented-out Python call: quantization="fp8",
				kwargs = append(kwargs, Word{Text: "--" + dashify(name) + "=" + value, Pos: w.pos})
			} else if ok {
				f.mentionEnv(name, w.pos, true) // # ENV NAME=1
			}
			switch {
			case isEnvName(t):
				f.mentionEnv(t, w.pos, true)
			case isDotted(t):
				f.Modules = append(f.Modules, Mention{Name: t, Pos: w.pos, Comment: true})
			case isIdent(t):
				f.Keys = append(f.Keys, Mention{Name: t, Pos: w.pos, Comment: true})
			}
		}
		if len(kwargs) > 0 {
			f.Commands = append(f.Commands, Command{Words: kwargs, Comment: true, recog: recog{prog: progVLLM, module: -1, script: -1}, Scope: f.scope})
		}
	}
	f.addShell(res, true, depth+1)
}
