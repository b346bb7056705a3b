package audit

import (
	"encoding/json"
	"strings"
)

// parseDockerfile reads RUN, CMD and ENTRYPOINT in exec (JSON) and shell
// form, and ENV and ARG, across backslash continuations.
func parseDockerfile(src string, f *facts) {
	lines := strings.Split(src, "\n")
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimLeft(lines[i], " \t")
		lead := len(lines[i]) - len(trimmed)
		if strings.TrimSpace(trimmed) == "" {
			continue
		}
		if trimmed[0] == '#' {
			f.addComment(trimmed[1:], Pos{i + 1, lead + 2}, 0)
			continue
		}
		last := i
		for last+1 < len(lines) && strings.HasSuffix(strings.TrimRight(lines[last], " \t\r"), "\\") {
			last++
		}
		n := 0
		for n < len(trimmed) && trimmed[n] != ' ' && trimmed[n] != '\t' {
			n++
		}
		rest := strings.TrimLeft(trimmed[n:], " \t")
		p := Pos{i + 1, lead + 1 + len(trimmed) - len(rest)}
		body := strings.Join(append([]string{rest}, lines[i+1:last+1]...), "\n")
		dockerInstruction(f, strings.ToUpper(trimmed[:n]), body, p)
		i = last
	}
}

func dockerInstruction(f *facts, inst, body string, p Pos) {
	switch inst {
	case "RUN", "CMD", "ENTRYPOINT":
		if words, ok := execForm(body, p); ok {
			f.Commands = append(f.Commands, Command{Words: words})
			for _, w := range words {
				f.scanLiteral(w.Text, w.Pos, Pos{w.Pos.Line, w.Pos.Col + 1}, false, 0)
			}
			return
		}
		f.addShell(lexShell(body, p, false), false, 0)
	case "ENV", "ARG":
		res := lexShell(body, p, true)
		if len(res.cmds) == 0 {
			return
		}
		ws := res.cmds[0]
		if _, _, ok := splitAssign(ws[0].text); !ok && inst == "ENV" && len(ws) > 1 {
			// Legacy "ENV NAME value with spaces".
			vals := make([]string, 0, len(ws)-1)
			for _, w := range ws[1:] {
				vals = append(vals, w.text)
			}
			f.env(ws[0].text, strings.Join(vals, " "), true, ws[0].pos, false)
			return
		}
		for _, w := range ws {
			if name, val, ok := splitAssign(w.text); ok {
				f.env(name, val, true, w.pos, false)
			} else if isIdent(w.text) {
				f.env(w.text, "", false, w.pos, false)
			}
		}
	}
}

// execForm reads ["a", "b"] and the place of each element. Docker runs
// anything that is not a valid JSON array of strings as a shell command,
// and so does this.
func execForm(body string, p Pos) ([]Word, bool) {
	s := strings.TrimSpace(body)
	if !strings.HasPrefix(s, "[") {
		return nil, false
	}
	var words []Word
	i := strings.IndexByte(body, '[') + 1
	for {
		i += skipJSONBlank(body[i:])
		if i >= len(body) {
			return nil, false
		}
		switch body[i] {
		case ']':
			return words, strings.TrimSpace(body[i+1:]) == ""
		case ',':
			i++
			continue
		case '"':
			end := jsonStringEnd(body, i)
			var text string
			if end < 0 || json.Unmarshal([]byte(body[i:end]), &text) != nil {
				return nil, false
			}
			words = append(words, Word{Text: text, Pos: advance(p, body[:i])})
			i = end
		default:
			return nil, false
		}
	}
}

// skipJSONBlank skips blanks and backslash-newline continuations.
func skipJSONBlank(s string) int {
	i := 0
	for i < len(s) {
		switch {
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n':
			i++
		case s[i] == '\\' && i+1 < len(s) && (s[i+1] == '\n' || s[i+1] == '\r'):
			i += 2
		default:
			return i
		}
	}
	return i
}

// jsonStringEnd returns the offset just after the string starting at i.
func jsonStringEnd(s string, i int) int {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		case '\n':
			return -1
		}
	}
	return -1
}
