package audit

import "strings"

// heredoc audits a here-document by what reads it: a file it is written
// to by its kind, a shell, Python or kubectl by theirs. Prose read by cat
// or anything else is left alone.
func (s *shellScan) heredoc(cmds [][]shWord, h shHeredoc) {
	if h.cmd < 0 || h.cmd >= len(cmds) || s.depth >= maxNesting {
		return
	}
	ws := cmds[h.cmd]
	k := kindNone
	for j := range ws {
		t := ws[j].text
		target := ""
		if t == ">" || t == ">>" {
			if j+1 < len(ws) {
				target = ws[j+1].text
			}
		} else if strings.HasPrefix(t, ">") {
			target = strings.TrimLeft(t, ">")
		}
		if target != "" {
			k = kindOf(target)
		}
	}
	if k == kindNone || k == kindSniff {
		k = readerKind(ws)
	}
	if k == kindNone {
		return
	}
	s.f.embed(k, h.body, h.pos, s.comment, s.depth+1)
}

// readerKind is the kind of text a command reads on its standard input.
func readerKind(ws []shWord) kind {
	i := 0
	for i < len(ws) && (wrappers[ws[i].text] || strings.HasPrefix(ws[i].text, "-")) {
		i++
	}
	if i >= len(ws) {
		return kindNone
	}
	p := ws[i].text
	if k := strings.LastIndexByte(p, '/'); k >= 0 {
		p = p[k+1:]
	}
	switch {
	case shells[p] || p == "ssh":
		return kindShell
	case isPython(p):
		return kindPython
	case p == "kubectl" || p == "oc" || p == "helm":
		return kindYAML
	case containerRunners[p]:
		return kindShell // docker exec -i c sh <<EOF
	}
	return kindNone
}

// embed parses text of another kind found inside this one (a here-document
// body) and moves what it found to where the text starts.
func (f *facts) embed(k kind, text string, at Pos, comment bool, depth int) {
	if k == kindShell || k == kindDotenv {
		f.addShell(lexShell(text, at, false), comment, depth)
		return
	}
	nc, ne, nk, nm := len(f.Commands), len(f.Env), len(f.Keys), len(f.Modules)
	nf, nn := len(f.EnvFiles), len(f.Notes)
	if parse(k, []byte(text), f) != nil {
		return // not the kind its reader expects: nothing is read from it
	}
	shift := func(p *Pos) {
		if p.Line == 1 {
			p.Col += at.Col - 1
		}
		p.Line += at.Line - 1
	}
	for i := nc; i < len(f.Commands); i++ {
		for j := range f.Commands[i].Words {
			shift(&f.Commands[i].Words[j].Pos)
		}
	}
	for i := ne; i < len(f.Env); i++ {
		shift(&f.Env[i].Pos)
	}
	for i := nk; i < len(f.Keys); i++ {
		shift(&f.Keys[i].Pos)
	}
	for i := nm; i < len(f.Modules); i++ {
		shift(&f.Modules[i].Pos)
	}
	for i := nf; i < len(f.EnvFiles); i++ {
		shift(&f.EnvFiles[i].Pos)
	}
	for i := nn; i < len(f.Notes); i++ {
		shift(&f.Notes[i].Pos)
	}
}
