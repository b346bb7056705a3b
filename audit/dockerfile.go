package audit

import (
	"encoding/json"
	"strings"
)

// dockerStage is one FROM ... stage: a scope of its own, whose ENTRYPOINT
// and CMD together make the image's command line.
type dockerStage struct {
	vllm       bool   // the base image's entrypoint is vLLM
	entry, cmd []Word // exec forms; nil when absent or in shell form
	entrySet   bool   // this stage set ENTRYPOINT (any form): the base's is gone
}

// parseDockerfile reads the parser directives, then RUN, CMD and
// ENTRYPOINT in exec (JSON) and shell form, here-documents, and ENV and
// ARG, across continuation lines (\, or the # escape= character).
func parseDockerfile(src string, f *facts) {
	src = dockerEscape(src)
	lines := strings.Split(src, "\n")
	stages := map[string]dockerStage{}
	var st dockerStage // before any FROM: a fragment of a Dockerfile
	end := func() { f.dockerImage(st) }
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
		inst := strings.ToUpper(trimmed[:n])
		i = last
		if inst == "FROM" {
			end()
			st = fromStage(body, stages)
			f.newScope()
			continue
		}
		if docs := heredocNames(inst, body); len(docs) > 0 {
			i = f.dockerHeredocs(inst, body, docs, lines, i+1)
			continue
		}
		f.dockerInstruction(&st, inst, body, p)
	}
	end()
}

// dockerEscape rewrites continuations written with the backtick escape
// (# escape=`, for Windows images) as backslash ones, byte for byte, so
// that the rest of the parser and the shell lexer see one convention.
func dockerEscape(src string) string {
	esc := byte('\\')
	for _, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if !strings.HasPrefix(t, "#") {
			break // directives come before anything else
		}
		k, v, ok := strings.Cut(strings.TrimSpace(t[1:]), "=")
		if !ok || strings.ContainsAny(strings.TrimSpace(k), " \t") {
			break
		}
		if strings.EqualFold(strings.TrimSpace(k), "escape") && strings.TrimSpace(v) == "`" {
			esc = '`'
		}
	}
	if esc == '\\' {
		return src
	}
	b := []byte(src)
	for i := range b {
		if b[i] != '`' {
			continue
		}
		j := i + 1
		for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\r') {
			j++
		}
		if j == len(b) || b[j] == '\n' {
			b[i] = '\\'
		}
	}
	return string(b)
}

// fromStage starts a stage from FROM [--platform=x] IMAGE [AS name].
func fromStage(body string, stages map[string]dockerStage) dockerStage {
	fields := strings.Fields(body)
	for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
		fields = fields[1:]
	}
	if len(fields) == 0 {
		return dockerStage{}
	}
	st, ok := stages[strings.ToLower(fields[0])]
	if !ok {
		st = dockerStage{vllm: isVLLMImage(fields[0])}
	}
	st.entrySet = false
	if len(fields) >= 3 && strings.EqualFold(fields[1], "AS") {
		defer func() { stages[strings.ToLower(fields[2])] = st }()
	}
	return st
}

// dockerImage records the command line a stage's image runs: ENTRYPOINT
// with CMD as its arguments, or CMD as the arguments of a vLLM base
// image's entrypoint. A CMD that is itself a vLLM command line (python3 -m
// vllm.entrypoints.openai.api_server on vllm/vllm-openai) is read as one:
// its author meant it to run, and as arguments of vllm serve its program
// would be a model name and the module the value of -m.
func (f *facts) dockerImage(st dockerStage) {
	var ws []Word
	switch {
	case st.entry != nil:
		ws = append(append(ws, st.entry...), st.cmd...)
	case st.cmd != nil && st.vllm && !st.entrySet && recognise(st.cmd).prog == progNone:
		f.Commands = append(f.Commands, Command{Words: st.cmd, recog: recog{prog: progVLLM, module: -1, script: -1}, Scope: f.scope})
		return
	case st.cmd != nil:
		ws = st.cmd
	default:
		return
	}
	f.command(ws, false, 0)
}

func (f *facts) dockerInstruction(st *dockerStage, inst, body string, p Pos) {
	switch inst {
	case "RUN", "CMD", "ENTRYPOINT":
		words, exec := execForm(body, p)
		switch {
		case inst == "ENTRYPOINT":
			st.entry, st.entrySet = words, true
		case inst == "CMD":
			st.cmd = words
		}
		if exec {
			for _, w := range words {
				if strings.HasPrefix(w.Text, "{") {
					f.jsonKeys(w.Text, Pos{w.Pos.Line, w.Pos.Col + 1}, false)
				}
			}
			if inst == "RUN" {
				f.command(words, false, 0)
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
			f.setEnv(ws[0].text, strings.Join(vals, " "), true, ws[0].pos, false, -1)
			return
		}
		for _, w := range ws {
			if name, val, ok := splitAssign(w.text); ok {
				f.setEnv(name, val, true, w.pos, false, -1)
			} else if isIdent(w.text) {
				f.mentionEnv(w.text, w.pos, false) // ARG NAME: no default here
			}
		}
	}
}

// heredocNames lists the here-document delimiters of RUN <<EOF and
// COPY <<EOF /path (BuildKit's syntax).
func heredocNames(inst, body string) []string {
	if inst != "RUN" && inst != "COPY" && inst != "ADD" {
		return nil
	}
	line, _, _ := strings.Cut(body, "\n")
	var out []string
	for _, w := range strings.Fields(line) {
		if d, ok := strings.CutPrefix(w, "<<"); ok {
			d = strings.Trim(strings.TrimPrefix(d, "-"), `"'`)
			if d != "" {
				out = append(out, d)
			}
		}
	}
	return out
}

// dockerHeredocs audits the bodies that follow the instruction's first
// line (at lines[from]) and returns the index of the last line used. A
// RUN body is a script (Python with a python #! line); a COPY body is read
// as the kind of file it is copied to.
func (f *facts) dockerHeredocs(inst, body string, delims []string, lines []string, from int) int {
	line, _, _ := strings.Cut(body, "\n")
	fields := strings.Fields(line)
	target := ""
	if len(fields) > 0 {
		target = fields[len(fields)-1]
	}
	i := from
	for _, d := range delims {
		start := i
		for i < len(lines) && strings.TrimRight(strings.TrimLeft(lines[i], "\t"), "\r") != d {
			i++
		}
		text := strings.Join(lines[start:min(i, len(lines))], "\n")
		first, _, _ := strings.Cut(text, "\n")
		k := kindShell
		if inst != "RUN" {
			k = kindOf(target)
		} else if strings.HasPrefix(text, "#!") && strings.Contains(first, "python") {
			k = kindPython
		}
		if k != kindNone && k != kindSniff {
			f.embed(k, text, Pos{start + 1, 1}, false, 1)
		}
		i++
	}
	return i - 1
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
			words = append(words, Word{Text: text, Pos: advance(p, body[:i]), Quoted: true})
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
