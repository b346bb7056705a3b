package audit

import (
	"encoding/json"
	"strings"
)

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
	allStr, fexpr := true, false
	for k := a; k < b; k++ {
		allStr = allStr && p.toks[k].kind == pyStr
		fexpr = fexpr || p.toks[k].fexpr
	}
	t := &p.toks[a]
	switch {
	case allStr:
		var s strings.Builder
		for k := a; k < b; k++ {
			s.WriteString(p.toks[k].text)
		}
		return s.String(), !fexpr
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
