package audit

import (
	"encoding/json"
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

// parsePython records commands (subprocess lists, command strings, keyword
// arguments and dict literals as --flag=value), environment uses
// (os.environ[...], getenv, env={...}), request keys, imports and comments.
func parsePython(src string, f *facts) {
	toks, notes := lexPython(src, tokSlabs.get(len(src)/6))
	defer tokSlabs.put(toks)
	p := &pyFile{src: src, toks: toks, match: matchBrackets(toks), f: f}
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
	for _, c := range notes {
		f.addComment(c.text, c.pos, 0)
	}
}

var tokSlabs slabPool[pyTok]

type pyFile struct {
	src   string
	toks  []pyTok
	match []int // for each opening bracket, its closing one; else -1
	f     *facts
}

func matchBrackets(toks []pyTok) []int {
	match := make([]int, len(toks))
	var stack []int
	for i, t := range toks {
		match[i] = -1
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
	return match
}

func (p *pyFile) is(i int, op string) bool {
	return i >= 0 && i < len(p.toks) && p.toks[i].kind == pyOp && p.toks[i].text == op
}

// str handles a string literal on its own; a docstring is prose, like a
// comment.
func (p *pyFile) str(i int) {
	t := &p.toks[i]
	alone := (i == 0 || p.toks[i-1].kind == pyNewline) && (i+1 == len(p.toks) || p.toks[i+1].kind == pyNewline)
	if alone {
		p.f.addComment(t.text, t.cpos, 0)
		return
	}
	p.f.scanLiteral(t.text, t.pos, t.cpos, false, 0)
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
		callee := ""
		if p.toks[i-1].kind == pyName {
			callee = p.toks[i-1].text
		}
		p.settings(elems, pyName, "=", callee)
	case open == "[" && callish:
		p.subscript(i)
	case open == "[" || open == "(":
		p.list(elems)
	case open == "{":
		p.settings(elems, pyStr, ":", "")
	}
}

// elements splits the inside of the bracket at i on its own commas.
func (p *pyFile) elements(i int) [][2]int {
	var out [][2]int
	start, end := i+1, p.match[i]
	for j := start; j < end; j++ {
		if p.match[j] > j {
			j = p.match[j]
			continue
		}
		if p.is(j, ",") {
			if j > start {
				out = append(out, [2]int{start, j})
			}
			start = j + 1
		}
	}
	if end > start {
		out = append(out, [2]int{start, end})
	}
	return out
}

// value renders tokens [a,b) as text; literal is false for expressions,
// whose text is then only the source.
func (p *pyFile) value(a, b int) (text string, literal bool) {
	if b <= a {
		return "", false
	}
	allStr := true
	for k := a; k < b; k++ {
		allStr = allStr && p.toks[k].kind == pyStr
	}
	t := &p.toks[a]
	switch {
	case allStr:
		var s strings.Builder
		for k := a; k < b; k++ {
			s.WriteString(p.toks[k].text)
		}
		return s.String(), true
	case b-a == 1 && t.kind == pyNum:
		return t.text, true
	case b-a == 1 && t.kind == pyName && (t.text == "True" || t.text == "False" || t.text == "None"):
		return map[string]string{"True": "true", "False": "false", "None": "null"}[t.text], true
	case b-a == 2 && p.is(a, "-") && p.toks[a+1].kind == pyNum:
		return "-" + p.toks[a+1].text, true
	case (p.is(a, "{") || p.is(a, "[")) && p.match[a] == b-1:
		if js, ok := p.json(a, b); ok {
			return js, true
		}
	case b-a >= 5 && t.text == "json" && p.is(a+1, ".") && p.toks[a+2].text == "dumps" && p.is(a+3, "(") && p.match[a+3] == b-1:
		// json.dumps({...}) is the JSON of its first argument.
		if el := p.elements(a + 3); len(el) > 0 {
			return p.value(el[0][0], el[0][1])
		}
	}
	return p.src[t.start:p.toks[b-1].end], false
}

// json converts a Python literal made of dicts, lists, strings, numbers and
// constants into JSON; anything else makes it an expression.
func (p *pyFile) json(a, b int) (string, bool) {
	var s strings.Builder
	for k := a; k < b; k++ {
		t := &p.toks[k]
		switch {
		case t.kind == pyStr:
			q, _ := json.Marshal(t.text)
			s.Write(q)
		case t.kind == pyNum:
			s.WriteString(t.text)
		case t.kind == pyName && (t.text == "True" || t.text == "False" || t.text == "None"):
			s.WriteString(map[string]string{"True": "true", "False": "false", "None": "null"}[t.text])
		case t.kind == pyOp && strings.Contains("{}[](),:", t.text):
			c := t.text
			switch c { // a tuple is a JSON array
			case "(":
				c = "["
			case ")":
				c = "]"
			}
			if (c == "}" || c == "]") && strings.HasSuffix(s.String(), ",") {
				str := s.String()
				s.Reset()
				s.WriteString(str[:len(str)-1]) // Python allows a trailing comma
			}
			s.WriteString(c)
		default:
			return "", false
		}
	}
	out := s.String()
	return out, json.Valid([]byte(out))
}

// settings turns a call's keyword arguments (name=value, sep "=") or a
// dict's entries ("name": value, sep ":") into one command of
// --name=value words, so that checks which need two settings together see
// them together. Each name is also a key, and an upper-case one an
// environment variable (env={...}, dict(os.environ, NAME=...)).
func (p *pyFile) settings(elems [][2]int, nameKind pyKind, sep, callee string) {
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
			p.f.env(name, val, lit, pos, false)
		}
	}
	if len(cmd.Words) > 0 {
		p.f.Commands = append(p.f.Commands, cmd)
	}
}

func (p *pyFile) list(elems [][2]int) {
	var cmd Command
	strs := 0
	for _, e := range elems {
		val, lit := p.value(e[0], e[1])
		isStr := lit && p.toks[e[0]].kind == pyStr
		if isStr {
			strs++
		}
		cmd.Words = append(cmd.Words, Word{Text: val, Pos: p.toks[e[0]].pos, Opaque: !isStr})
	}
	if strs > 0 {
		p.f.Commands = append(p.f.Commands, cmd)
	}
}

// subscript records os.environ["NAME"] = value; a read is already an
// environment use through the string itself.
func (p *pyFile) subscript(i int) {
	end := p.match[i]
	if end != i+2 || p.toks[i+1].kind != pyStr || !p.is(end+1, "=") {
		return
	}
	name := p.toks[i+1].text
	if !isEnvName(name) {
		return
	}
	b := end + 2
	for b < len(p.toks) && p.toks[b].kind != pyNewline {
		b++
	}
	val, lit := p.value(end+2, b)
	p.f.env(name, val, lit, p.toks[i+1].pos, false)
}

// imports records "import a.b" and "from a.b import c" (as a.b and a.b.c).
func (p *pyFile) imports(i int) {
	mod, j, pos := p.dotted(i + 1)
	if mod == "" {
		return
	}
	p.module(mod, pos)
	if p.toks[i].text == "import" {
		for {
			if j < len(p.toks) && p.toks[j].text == "as" {
				j += 2
			}
			if !p.is(j, ",") {
				return
			}
			if mod, j, pos = p.dotted(j + 1); mod == "" {
				return
			}
			p.module(mod, pos)
		}
	}
	if j >= len(p.toks) || p.toks[j].text != "import" {
		return
	}
	for j++; j < len(p.toks) && p.toks[j].kind != pyNewline; j++ {
		t := &p.toks[j]
		if t.kind == pyName && t.text != "as" && !p.is(j-1, "as") && t.text != "import" {
			p.module(mod+"."+t.text, t.pos)
		}
	}
}

func (p *pyFile) dotted(j int) (string, int, Pos) {
	if j >= len(p.toks) || p.toks[j].kind != pyName {
		return "", j, Pos{}
	}
	pos := p.toks[j].pos
	var s strings.Builder
	s.WriteString(p.toks[j].text)
	j++
	for p.is(j, ".") && j+1 < len(p.toks) && p.toks[j+1].kind == pyName {
		s.WriteString("." + p.toks[j+1].text)
		j += 2
	}
	return s.String(), j, pos
}

func (p *pyFile) module(name string, pos Pos) {
	p.f.Modules = append(p.f.Modules, Mention{Name: name, Pos: pos})
}

// dashify spells a keyword or config key as the CLI flag vLLM derives
// from it.
func dashify(s string) string { return strings.ReplaceAll(s, "_", "-") }
