package audit

import (
	"path"
	"slices"
	"strconv"
	"strings"
)

// flagUse is one flag in an argument list, with its value if it has one.
type flagUse struct {
	name    string // normalised: --a-b
	value   string
	hasVal  bool
	inline  bool // --flag=value, or a keyword argument
	opaque  bool
	pos     Pos
	comment bool
}

// commandFlags appends to out the flags of c's program: "--flag value",
// "--flag=value" and "-f value". A next word that starts with "-" is
// another flag, not a value.
func commandFlags(out []flagUse, c *Command) []flagUse {
	for i := c.args; i < len(c.Words); i++ {
		w := &c.Words[i]
		t := w.Text
		if len(t) < 2 || t[0] != '-' || t == "--" || !(t[1] == '-' || isIdentStart(t[1])) {
			continue
		}
		fu := flagUse{name: t, pos: w.Pos, comment: c.Comment}
		if eq := strings.IndexByte(t, '='); eq > 0 {
			fu.name, fu.value, fu.hasVal, fu.inline, fu.opaque = t[:eq], t[eq+1:], true, true, w.Opaque
		} else if i+1 < len(c.Words) && !strings.HasPrefix(c.Words[i+1].Text, "-") {
			fu.value, fu.hasVal, fu.opaque = c.Words[i+1].Text, true, c.Words[i+1].Opaque
		}
		fu.name = normalizeFlag(fu.name)
		out = append(out, fu)
	}
	return out
}

// matchesFlag reports whether the flag use satisfies the match.
func (m *Match) matchesFlag(fu *flagUse) bool {
	if !slices.Contains(m.flagNames(), fu.name) {
		return false
	}
	if len(m.Values) == 0 && m.Contains == "" && m.Above == nil && !m.NotInteger {
		return m.present(fu)
	}
	return fu.hasVal && !fu.opaque && m.valueOK(fu.value)
}

// present: a boolean flag is on unless it is spelled --flag=false (or
// enable_x=False); a word after it is the next positional argument, not
// its value.
func (m *Match) present(fu *flagUse) bool {
	if !fu.inline {
		return true
	}
	if fu.opaque {
		return false
	}
	switch strings.ToLower(fu.value) {
	case "false", "0", "no", "off", "null":
		return false
	}
	return true
}

func (m *Match) valueOK(v string) bool {
	if m.NotInteger {
		_, err := strconv.Atoi(strings.TrimSpace(v))
		return err != nil
	}
	if len(m.Values) > 0 && !slices.Contains(m.Values, v) {
		return false
	}
	if m.Contains != "" && !strings.Contains(v, m.Contains) {
		return false
	}
	if m.Above != nil {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || n <= *m.Above {
			return false
		}
	}
	return true
}

func (m *Match) matchesEnv(e *EnvUse) bool {
	if e.Name != m.Env {
		return false
	}
	if len(m.Values) == 0 && m.Contains == "" && m.Above == nil && !m.NotInteger {
		return true
	}
	return e.HasValue && m.valueOK(e.Value)
}

// fileScan is one file's facts with the rules that could match it.
type fileScan struct {
	rs     *RuleSet
	path   string
	facts  *facts
	active []bool
	flags  [][]flagUse // per command
	out    []Finding
}

func (s *fileScan) add(r *Rule, p Pos, comment bool, detail string) {
	s.out = append(s.out, newFinding(s.path, r, p, comment, detail))
}

// evaluate runs every active rule over the file's facts: flag rules on
// vLLM's command lines, environment rules where a variable is set (a
// mention is a note), module and key rules where they are named.
func (s *fileScan) evaluate() []Finding {
	f := s.facts
	s.flags = make([][]flagUse, len(f.Commands))
	n := 0
	for i := range f.Commands {
		for _, w := range f.Commands[i].Words {
			if strings.HasPrefix(w.Text, "-") {
				n++
			}
		}
	}
	all := make([]flagUse, 0, n) // one array for every command's flags
	for i := range f.Commands {
		c := &f.Commands[i]
		start := len(all)
		if c.prog != progNone {
			all = commandFlags(all, c)
		}
		s.flags[i] = all[start:len(all):len(all)]
		if c.prog == progVLLM {
			for j := range s.flags[i] {
				fu := &s.flags[i][j]
				for _, r := range s.rs.byFlag[fu.name] {
					if s.active[r.idx] && r.appliesTo(c) && r.matchesFlag(fu) {
						s.add(r, fu.pos, c.Comment, "")
					}
				}
			}
		}
		if c.module >= 0 {
			w := &c.Words[c.module]
			name, _, _ := strings.Cut(w.Text, ":")
			s.module(name, w.Pos, c.Comment)
		}
	}
	for i := range f.Env {
		e := &f.Env[i]
		for _, r := range s.rs.byEnv[e.Name] {
			if !s.active[r.idx] || !r.matchesEnv(e) {
				continue
			}
			if e.Set || e.Comment {
				s.add(r, e.Pos, e.Comment, "")
			} else {
				s.out = append(s.out, mentionFinding(s.path, r, e.Pos))
			}
		}
	}
	for _, m := range f.Modules {
		s.module(m.Name, m.Pos, m.Comment)
	}
	for _, k := range f.Keys {
		for _, r := range s.rs.byKey[k.Name] {
			if s.active[r.idx] && (k.Call == "" || !slices.Contains(r.ExceptCalls, k.Call)) {
				s.add(r, k.Pos, k.Comment, "")
			}
		}
	}
	for _, p := range f.Notes {
		s.add(ruleBadLine, p.Pos, false, p.Msg)
	}
	s.checks()
	return s.out
}

// subcommand is the vLLM subcommand a command line runs: preload, or
// serve for everything else, fragments of flags and engine keywords
// included (they configure a server).
func subcommand(c *Command) string {
	if c.args > 0 && c.args < len(c.Words) && c.Words[c.args].Text == "preload" {
		return "preload"
	}
	return "serve"
}

// appliesTo reports whether a rule limited to some subcommands applies to
// the command line.
func (r *Rule) appliesTo(c *Command) bool {
	if r.CLI && !(c.args > 0 && c.args < len(c.Words) && path.Base(c.Words[c.args-1].Text) == "vllm") {
		return false
	}
	return len(r.Sub) == 0 || slices.Contains(r.Sub, subcommand(c))
}

// module matches "vllm.entrypoints.openai.api_server" as a word (python -m,
// uvicorn's module:app) or an import.
func (s *fileScan) module(name string, p Pos, comment bool) {
	for _, r := range s.rs.byModule[name] {
		if s.active[r.idx] {
			s.add(r, p, comment, "")
		}
	}
}
