package audit

import (
	"slices"
	"strings"
)

// pyKeywords may stand before "(" or "[" without making it a call or a
// subscript.
var pyKeywords = map[string]bool{
	"if": true, "elif": true, "while": true, "for": true, "in": true, "not": true,
	"and": true, "or": true, "is": true, "return": true, "yield": true, "assert": true,
	"lambda": true, "with": true, "as": true, "else": true, "await": true, "del": true,
	"raise": true, "except": true, "import": true, "from": true,
}

// engineCalls construct a vLLM engine: their keywords are engine settings.
var engineCalls = map[string]bool{
	"LLM": true, "EngineArgs": true, "AsyncEngineArgs": true, "LLMEngine": true,
	"AsyncLLMEngine": true, "AsyncLLM": true,
}

// proseCalls print or log their arguments: a command line in them is text.
var proseCalls = map[string]bool{
	"print": true, "log": true, "debug": true, "info": true, "warning": true, "warn": true,
	"error": true, "exception": true, "critical": true, "fatal": true, "echo": true,
	"secho": true, "write": true, "format": true,
}

// shellCalls run a string as a shell script.
var shellCalls = map[string]bool{"system": true, "popen": true, "create_subprocess_shell": true, "getoutput": true, "getstatusoutput": true}

// execCalls take a program and its arguments as separate arguments.
var execCalls = map[string]bool{
	"create_subprocess_exec": true, "execlp": true, "execl": true, "spawnlp": true,
}

// parsePython records commands (argv lists and command strings that run
// vLLM, engine keywords and the dicts passed as them), environment
// settings (os.environ[...] =, setdefault, env={...}) and reads, request
// keys, imports and comments.
func parsePython(src string, f *facts) {
	toks, notes := lexPython(src, tokSlabs.get(len(src)/6))
	defer tokSlabs.put(toks)
	p := &pyFile{src: src, toks: toks, f: f}
	p.match, p.parent = matchBrackets(toks)
	p.lines(toks)
	for i, t := range toks {
		switch {
		case t.kind == pyStr:
			p.str(i)
		case t.kind == pyOp && p.match[i] > i:
			p.group(i)
		case t.kind == pyName && (t.text == "import" || t.text == "from") && (i == 0 || toks[i-1].kind == pyNewline):
			p.imports(i)
		}
	}
	p.fragments()
	for _, c := range notes {
		f.addComment(c.text, c.pos, 0)
	}
}

var tokSlabs slabPool[pyTok]

type pyFile struct {
	src    string
	toks   []pyTok
	match  []int // for each opening bracket, its closing one; else -1
	parent []int // for each token, the innermost bracket around it; else -1
	line   []int // for each token, its logical line
	f      *facts
	// prose: tokens before this index are inside a print or log call.
	prose int
	// What names were bound to, for arguments that reach a command line
	// through a variable: vllm names hold a vLLM argv; dicts hold a dict
	// literal not yet known to be engine keywords.
	vllm        map[string]bool
	vllmLines   map[int]bool
	dicts       map[string]Command
	engineDicts map[int]bool // { tokens passed as **{...} to an engine
	frags       []pyFrag
}

// pyFrag is a list of flags (["--quantization", "fp8"], "--port 1") that
// is vLLM's if it reaches a vLLM command line.
type pyFrag struct {
	cmd  Command
	line int
	name string // the variable it is bound to, if any
}

func matchBrackets(toks []pyTok) (match, parent []int) {
	match, parent = make([]int, len(toks)), make([]int, len(toks))
	var stack []int
	for i, t := range toks {
		match[i], parent[i] = -1, -1
		if n := len(stack); n > 0 {
			parent[i] = stack[n-1]
		}
		if t.kind != pyOp || len(t.text) != 1 {
			continue
		}
		switch t.text[0] {
		case '(', '[', '{':
			stack = append(stack, i)
		case ')', ']', '}':
			if n := len(stack); n > 0 {
				match[stack[n-1]] = i
				stack = stack[:n-1]
			}
		}
	}
	return match, parent
}

// lines numbers the logical lines.
func (p *pyFile) lines(toks []pyTok) {
	p.line = make([]int, len(toks))
	n := 0
	for i, t := range toks {
		p.line[i] = n
		if t.kind == pyNewline {
			n++
		}
	}
}

func (p *pyFile) is(i int, op string) bool {
	return i >= 0 && i < len(p.toks) && p.toks[i].kind == pyOp && p.toks[i].text == op
}

// callee is the name called by the bracket at i, or "".
func (p *pyFile) callee(i int) string {
	if i > 0 && p.is(i, "(") && p.toks[i-1].kind == pyName {
		return p.toks[i-1].text
	}
	return ""
}

// boundTo is NAME when the logical line holding token i starts NAME =.
func (p *pyFile) boundTo(i int) string {
	k := i
	for k > 0 && p.toks[k-1].kind != pyNewline {
		k--
	}
	if k+1 < len(p.toks) && p.toks[k].kind == pyName && (p.is(k+1, "=") || p.is(k+1, "+=")) {
		return p.toks[k].text
	}
	return ""
}

// str handles a string literal: a docstring is prose, like a comment; a
// string in a print or log call is text; an argv list's element is read
// with its list; anything else may be a command line.
func (p *pyFile) str(i int) {
	t := &p.toks[i]
	alone := (i == 0 || p.toks[i-1].kind == pyNewline) && (i+1 == len(p.toks) || p.toks[i+1].kind == pyNewline)
	if alone {
		p.f.addComment(t.text, t.cpos, 0)
		return
	}
	if i < p.prose || (i > 0 && p.toks[i-1].kind == pyStr) {
		return // printed text, or the rest of a concatenation read with its first part
	}
	end := i + 1
	for end < len(p.toks) && p.toks[end].kind == pyStr {
		end++
	}
	if par := p.parent[i]; par >= 0 && (p.is(par, "[") || (p.is(par, "(") && p.callee(par) == "" && end == i+1)) {
		if strings.HasPrefix(strings.TrimSpace(t.text), "{") {
			p.f.jsonKeys(t.text, t.cpos, false)
		}
		return
	}
	n := len(p.f.Commands)
	if end > i+1 || strings.HasPrefix(strings.TrimSpace(t.text), "-") {
		// "vllm serve m " "--quantization fp8" over several lines, each
		// part lexed where it is written; or "--quantization fp8", a
		// fragment as a list of flags is.
		var ws []Word
		for k := i; k < end; k++ {
			from := len(ws)
			ws = flatWords(ws, lexShell(p.toks[k].text, p.toks[k].cpos, true))
			for j := from; j < len(ws); j++ {
				ws[j].Opaque = p.toks[k].fexpr && strings.Contains(ws[j].Text, "{") // an f-string's {expr}
			}
		}
		p.argv(ws, i)
		return
	}
	// A string is one argument list unless a shell runs it.
	fold := true
	if par := p.parent[i]; par >= 0 && shellCalls[p.callee(par)] {
		fold = false
	}
	p.f.literal(t.text, t.pos, t.cpos, false, fold, 0)
	for k := n; k < len(p.f.Commands); k++ {
		if p.f.Commands[k].prog == progVLLM {
			p.markVLLM(i)
		}
	}
}

func (p *pyFile) markVLLM(i int) {
	if p.vllmLines == nil {
		p.vllmLines, p.vllm = map[int]bool{}, map[string]bool{}
	}
	p.vllmLines[p.line[i]] = true
	if name := p.boundTo(i); name != "" {
		p.vllm[name] = true
	}
}

func (p *pyFile) group(i int) {
	open := p.toks[i].text
	callish := false
	if i > 0 {
		prev := &p.toks[i-1]
		callish = (prev.kind == pyName && !pyKeywords[prev.text]) || p.is(i-1, ")") || p.is(i-1, "]")
	}
	elems := p.elements(i)
	switch {
	case open == "(" && callish:
		p.call(i, elems)
	case open == "[" && callish:
		p.subscript(i)
	case open == "[" || open == "(":
		p.list(i, elems)
	case open == "{":
		cmd := p.settings(elems, pyStr, ":", "")
		switch name := p.boundTo(i); {
		case p.engineDicts[i]:
			p.engine(cmd)
		case name != "" && len(cmd.Words) > 0:
			if p.dicts == nil {
				p.dicts = map[string]Command{}
			}
			p.dicts[name] = cmd
		}
	}
}

// call reads a call's arguments by what is called.
func (p *pyFile) call(i int, elems [][2]int) {
	callee := p.callee(i)
	if proseCalls[callee] || (i >= 2 && p.toks[i-2].text == "raise") {
		p.prose = max(p.prose, p.match[i])
		return
	}
	if i >= 3 && p.is(i-2, ".") && p.toks[i-3].text == "environ" || callee == "getenv" || callee == "putenv" {
		p.environCall(callee, elems)
	}
	cmd := p.settings(elems, pyName, "=", callee)
	switch {
	case engineCalls[callee]:
		for _, e := range elems {
			// LLM(**kw), LLM(**{...}): the dict's entries are keywords too.
			if a := e[0]; p.is(a, "**") && a+1 < e[1] {
				if p.toks[a+1].kind == pyName {
					if d, ok := p.dicts[p.toks[a+1].text]; ok {
						p.engine(d)
					}
				} else if p.is(a+1, "{") {
					if p.engineDicts == nil {
						p.engineDicts = map[int]bool{}
					}
					p.engineDicts[a+1] = true
				}
			}
		}
		p.engine(cmd)
		p.markVLLM(i)
	case execCalls[callee]:
		p.list(i, elems)
	}
}

func (p *pyFile) engine(cmd Command) {
	if len(cmd.Words) > 0 {
		cmd.recog = recog{prog: progVLLM, module: -1, script: -1}
		cmd.Scope = p.f.scope
		p.f.Commands = append(p.f.Commands, cmd)
	}
}

// environCall reads os.environ.setdefault/get/pop/update and os.getenv.
func (p *pyFile) environCall(callee string, elems [][2]int) {
	if len(elems) == 0 || p.toks[elems[0][0]].kind != pyStr {
		return
	}
	t := &p.toks[elems[0][0]]
	if !isEnvName(t.text) {
		return
	}
	switch callee {
	case "setdefault", "putenv":
		if len(elems) > 1 {
			val, lit := p.value(elems[1][0], elems[1][1])
			p.f.setEnv(t.text, val, lit, t.pos, false, -1)
		}
	case "get", "getenv", "pop":
		p.f.mentionEnv(t.text, t.pos, false)
	}
}

// settings turns a call's keyword arguments (name=value, sep "=") or a
// dict's entries ("name": value, sep ":") into one command of --name=value
// words, for when they turn out to be engine settings. Each name is also a
// key, and an upper-case one sets an environment variable (env={...},
// dict(os.environ, NAME=...)).
func (p *pyFile) settings(elems [][2]int, nameKind pyKind, sep, callee string) Command {
	var cmd Command
	for _, e := range elems {
		a, b := e[0], e[1]
		if b-a < 3 || p.toks[a].kind != nameKind || !p.is(a+1, sep) {
			continue
		}
		name, pos := p.toks[a].text, p.toks[a].pos
		val, lit := p.value(a+2, b)
		cmd.Words = append(cmd.Words, Word{Text: "--" + dashify(name) + "=" + val, Pos: pos, Opaque: !lit})
		p.f.Keys = append(p.f.Keys, Mention{Name: name, Pos: pos, Call: callee})
		if isEnvName(name) {
			p.f.setEnv(name, val, lit, pos, false, -1)
		}
	}
	return cmd
}

// list reads a list, tuple or exec-style argument list as an argv.
func (p *pyFile) list(i int, elems [][2]int) {
	var ws []Word
	strs := 0
	for _, e := range elems {
		if p.is(e[0], "*") && e[1]-e[0] == 2 && p.toks[e[0]+1].kind == pyName {
			continue // *extra: a name, which fragments() follows
		}
		val, lit := p.value(e[0], e[1])
		t := &p.toks[e[0]]
		isStr := lit && t.kind == pyStr
		if isStr {
			strs++
		}
		ws = append(ws, Word{Text: val, Pos: t.pos, Opaque: !isStr, Quoted: t.kind == pyStr})
	}
	if strs > 0 {
		p.argv(ws, i)
	}
}

// argv records an argument list that runs vLLM, or keeps a list of flags
// until fragments() knows where it goes.
func (p *pyFile) argv(ws []Word, i int) {
	if i < p.prose {
		return
	}
	if startsWithFlag(ws) {
		p.frags = append(p.frags, pyFrag{cmd: Command{Words: ws, recog: recog{prog: progVLLM, module: -1, script: -1}}, line: p.line[i], name: p.boundTo(i)})
		return
	}
	if p.f.command(ws, false, 1) == progVLLM {
		p.markVLLM(i)
	}
}

// fragments decides the lists of flags: one on a line with a vLLM command
// line, or bound to a name used on such a line, is vLLM's; one bound to a
// name used nowhere else is taken to end up on one elsewhere.
func (p *pyFile) fragments() {
	if len(p.frags) == 0 {
		return
	}
	uses := map[string][]int{} // name -> logical lines it appears on
	for i, t := range p.toks {
		if t.kind == pyName {
			uses[t.text] = append(uses[t.text], p.line[i])
		}
	}
	vllmLine := func(l int) bool {
		if p.vllmLines[l] {
			return true
		}
		for name := range p.vllm {
			if slices.Contains(uses[name], l) {
				return true
			}
		}
		return false
	}
	for _, fr := range p.frags {
		ok := vllmLine(fr.line)
		if !ok && fr.name != "" {
			elsewhere := false
			for _, l := range uses[fr.name] {
				if l != fr.line {
					elsewhere = true
					ok = ok || vllmLine(l)
				}
			}
			ok = ok || !elsewhere
		}
		if ok {
			fr.cmd.Scope = p.f.scope
			p.f.Commands = append(p.f.Commands, fr.cmd)
		}
	}
}

// subscript records os.environ["NAME"] = value as set, and a read of
// os.environ["NAME"] as a mention.
func (p *pyFile) subscript(i int) {
	end := p.match[i]
	if end != i+2 || p.toks[i+1].kind != pyStr || i < 1 || p.toks[i-1].text != "environ" {
		return
	}
	name := p.toks[i+1].text
	if !isEnvName(name) {
		return
	}
	if !p.is(end+1, "=") {
		p.f.mentionEnv(name, p.toks[i+1].pos, false)
		return
	}
	b := end + 2
	for b < len(p.toks) && p.toks[b].kind != pyNewline {
		b++
	}
	val, lit := p.value(end+2, b)
	p.f.setEnv(name, val, lit, p.toks[i+1].pos, false, -1)
}
