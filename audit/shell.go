package audit

import "strings"

// The shell lexer splits text into commands and words the way sh does for
// the parts that decide which argument a flag or value ends up in: quotes,
// backslash escapes, backslash-newline continuations, $NAME references and
// command separators. It never fails: unterminated quotes run to the end,
// because comments and fragments of other languages pass through it too.

// shWord is one shell word.
type shWord struct {
	text   string
	pos    Pos
	lead   byte // first byte as written: a quote means "not an assignment"
	quoted bool
	refs   []shRef
	// raw is the word as written, quotes included.
	raw string
}

// shRef is a $NAME or ${NAME...} reference outside single quotes; start and
// end are byte offsets into the word's text, so that expansion replaces only
// real references.
type shRef struct {
	name       string
	def        string // the default of ${NAME:-def}
	hasDef     bool
	pos        Pos
	start, end int
}

type shComment struct {
	text string
	pos  Pos // of the '#'
}

type shResult struct {
	cmds     [][]shWord
	comments []shComment
	heredocs []shHeredoc
	// closes holds, for each ")", how many commands came before it: the
	// end of an array assignment, NAME=( ... ).
	closes []int
	words  []shWord // the array cmds are windows on, for reuse
}

// shHeredoc is the body of a here-document (cmd <<EOF ... EOF), kept out
// of the command stream: what it is depends on the command that reads it.
type shHeredoc struct {
	// cmd indexes the last command on the operator's line, which is what
	// reads the body: bash <<EOF, cat <<EOF | sh, cat > run.sh <<EOF.
	cmd  int
	body string
	pos  Pos // of the body's first byte
}

var wordSlabs slabPool[shWord]

type shLexer struct {
	src string
	i   int
	at  Pos // of src[i]
	// fold makes newlines plain blanks, as in a folded YAML scalar.
	fold bool
}

// lexShell splits src, whose first byte is at base.
func lexShell(src string, base Pos, fold bool) shResult {
	lx := &shLexer{src: src, at: base, fold: fold}
	res := shResult{cmds: make([][]shWord, 0, strings.Count(src, "\n")+1)}
	// Commands are windows on one array of words, which saves an
	// allocation per command; a window keeps its words if the array moves.
	words := wordSlabs.get(len(src)/8 + 1)
	first := 0
	// Here-documents whose bodies start after the current line.
	var pending []string
	var dash []bool
	flush := func() {
		if len(words) > first {
			res.cmds = append(res.cmds, words[first:len(words):len(words)])
			first = len(words)
		}
	}
	for lx.i < len(src) {
		switch c := src[lx.i]; c {
		case ' ', '\t', '\r':
			lx.adv()
		case '\\':
			if lx.peek(1) == '\n' {
				lx.adv()
				lx.adv()
				continue
			}
			words = append(words, lx.word())
		case '\n':
			lx.adv()
			if !lx.fold {
				flush()
			}
			for k, delim := range pending {
				h := lx.heredoc(delim, dash[k])
				h.cmd = len(res.cmds) - 1
				res.heredocs = append(res.heredocs, h)
			}
			pending, dash = pending[:0], dash[:0]
		case ';', '&', '|', '(', ')':
			lx.adv()
			flush()
			if c == ')' {
				res.closes = append(res.closes, len(res.cmds))
			}
		case '#':
			res.comments = append(res.comments, lx.comment())
		default:
			w := lx.word()
			words = append(words, w)
			if d, ok := strings.CutPrefix(w.text, "<<"); ok && !strings.HasPrefix(d, "<") && !lx.fold {
				strip := strings.HasPrefix(d, "-")
				d = strings.TrimPrefix(d, "-")
				if d == "" { // << EOF: the delimiter is the next word
					lx.blanks()
					if lx.i < len(src) && src[lx.i] != '\n' {
						dw := lx.word()
						words = append(words, dw)
						d = dw.text
					}
				}
				if d != "" {
					pending, dash = append(pending, d), append(dash, strip)
				}
			}
		}
	}
	flush()
	res.words = words
	return res
}

func (lx *shLexer) blanks() {
	for lx.i < len(lx.src) && (lx.src[lx.i] == ' ' || lx.src[lx.i] == '\t') {
		lx.adv()
	}
}

// heredoc reads a body up to the line that is its delimiter (after tabs,
// for <<-), and steps over that line.
func (lx *shLexer) heredoc(delim string, stripTabs bool) shHeredoc {
	h := shHeredoc{pos: lx.pos()}
	start := lx.i
	for lx.i < len(lx.src) {
		end := strings.IndexByte(lx.src[lx.i:], '\n')
		if end < 0 {
			end = len(lx.src) - lx.i
		}
		line := strings.TrimRight(lx.src[lx.i:lx.i+end], "\r")
		if stripTabs {
			line = strings.TrimLeft(line, "\t")
		}
		if line == delim {
			h.body = lx.src[start:lx.i]
			for k := 0; k <= end && lx.i < len(lx.src); k++ {
				lx.adv()
			}
			return h
		}
		for k := 0; k <= end && lx.i < len(lx.src); k++ {
			lx.adv()
		}
	}
	h.body = lx.src[start:]
	return h
}

func (lx *shLexer) pos() Pos { return lx.at }

func (lx *shLexer) peek(n int) byte {
	if lx.i+n < len(lx.src) {
		return lx.src[lx.i+n]
	}
	return 0
}

// adv steps over one byte.
func (lx *shLexer) adv() {
	lx.at = lx.at.step(lx.src[lx.i])
	lx.i++
}

func (lx *shLexer) comment() shComment {
	c := shComment{pos: lx.pos()}
	start := lx.i
	for lx.i < len(lx.src) && lx.src[lx.i] != '\n' {
		lx.adv()
	}
	c.text = lx.src[start:lx.i]
	return c
}

func (lx *shLexer) word() (w shWord) {
	w = shWord{pos: lx.pos(), lead: lx.src[lx.i]}
	// Most words have no quotes, escapes or expansions: they are a slice
	// of the source, with no copy.
	start := lx.i
	for lx.i < len(lx.src) && plainByte[lx.src[lx.i]] {
		lx.adv()
	}
	if lx.i == len(lx.src) || wordEnd[lx.src[lx.i]] {
		w.text = lx.src[start:lx.i]
		w.raw = w.text
		return w
	}
	defer func() { w.raw = lx.src[start:lx.i] }()
	var b strings.Builder
	b.WriteString(lx.src[start:lx.i])
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		switch c {
		case ' ', '\t', '\r', '\n', ';', '|', '(', ')':
			w.text = b.String()
			return w
		case '&':
			// 2>&1 is one word; a bare & ends the command.
			if s := b.String(); s == "" || (s[len(s)-1] != '>' && s[len(s)-1] != '<') {
				w.text = s
				return w
			}
			b.WriteByte(c)
			lx.adv()
		case '\\':
			lx.adv()
			if lx.i < len(lx.src) {
				if lx.src[lx.i] != '\n' {
					b.WriteByte(lx.src[lx.i])
				}
				lx.adv()
			}
		case '\'':
			w.quoted = true
			lx.adv()
			lx.until(&b, '\'')
		case '"':
			w.quoted = true
			lx.adv()
			lx.dquote(&b, &w)
		case '$':
			lx.dollar(&b, &w)
		case '`':
			start := lx.i
			lx.adv()
			for lx.i < len(lx.src) && lx.src[lx.i] != '`' {
				lx.adv()
			}
			if lx.i < len(lx.src) {
				lx.adv()
			}
			b.WriteString(lx.src[start:lx.i])
		default:
			b.WriteByte(c)
			lx.adv()
		}
	}
	w.text = b.String()
	return w
}

var plainByte, wordEnd = func() (plain, end [256]bool) {
	for c := range 256 {
		plain[c] = true
	}
	for _, c := range []byte(" \t\r\n;|()&\\'\"$`") {
		plain[c] = false
	}
	for _, c := range []byte(" \t\r\n;|()") {
		end[c] = true
	}
	return plain, end
}()

// until copies bytes up to the closing quote q and steps over it.
func (lx *shLexer) until(b *strings.Builder, q byte) {
	for lx.i < len(lx.src) && lx.src[lx.i] != q {
		b.WriteByte(lx.src[lx.i])
		lx.adv()
	}
	if lx.i < len(lx.src) {
		lx.adv()
	}
}

func (lx *shLexer) dquote(b *strings.Builder, w *shWord) {
	for lx.i < len(lx.src) {
		switch c := lx.src[lx.i]; c {
		case '"':
			lx.adv()
			return
		case '\\':
			next := lx.peek(1)
			lx.adv()
			switch next {
			case '\n':
				lx.adv()
			case '"', '\\', '$', '`':
				b.WriteByte(next)
				lx.adv()
			default:
				b.WriteByte('\\')
			}
		case '$':
			lx.dollar(b, w)
		default:
			b.WriteByte(c)
			lx.adv()
		}
	}
}

// dollar copies a $ expansion as written and records $NAME references.
func (lx *shLexer) dollar(b *strings.Builder, w *shWord) {
	p, start := lx.pos(), lx.i
	lx.adv()
	switch next := lx.peek(0); {
	case next == '\'':
		// $'...': ANSI-C quoting; escapes other than \' are kept as written.
		w.quoted = true
		lx.adv()
		for lx.i < len(lx.src) && lx.src[lx.i] != '\'' {
			if lx.src[lx.i] == '\\' && lx.peek(1) == '\'' {
				lx.adv()
			}
			b.WriteByte(lx.src[lx.i])
			lx.adv()
		}
		if lx.i < len(lx.src) {
			lx.adv()
		}
	case next == '{':
		lx.skipNested('{', '}')
		raw := lx.src[start:lx.i]
		ref := braceRef(raw, p)
		ref.start = b.Len()
		b.WriteString(raw)
		ref.end = b.Len()
		if ref.name != "" {
			w.refs = append(w.refs, ref)
		}
	case next == '(':
		lx.skipNested('(', ')')
		b.WriteString(lx.src[start:lx.i])
	case isIdentStart(next):
		for lx.i < len(lx.src) && isIdentByte(lx.src[lx.i]) {
			lx.adv()
		}
		ref := shRef{name: lx.src[start+1 : lx.i], pos: p, start: b.Len()}
		b.WriteString(lx.src[start:lx.i])
		ref.end = b.Len()
		w.refs = append(w.refs, ref)
	default:
		b.WriteByte('$')
	}
}

// skipNested steps over a bracketed expansion, counting nesting.
func (lx *shLexer) skipNested(open, close byte) {
	depth := 0
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		lx.adv()
		if c == open {
			depth++
		} else if c == close {
			if depth--; depth == 0 {
				return
			}
		}
	}
}

// braceRef reads ${NAME}, ${NAME:-def} and ${NAME-def}; other operators
// (${#NAME}, ${NAME%x}) still name the variable but give no default.
func braceRef(raw string, p Pos) shRef {
	body := strings.TrimSuffix(strings.TrimPrefix(raw, "${"), "}")
	n := 0
	for n < len(body) && isIdentByte(body[n]) {
		n++
	}
	r := shRef{name: body[:n], pos: p}
	if n == 0 || !isIdentStart(body[0]) {
		return shRef{}
	}
	rest := body[n:]
	if d, ok := strings.CutPrefix(rest, ":-"); ok {
		r.def, r.hasDef = d, true
	} else if d, ok := strings.CutPrefix(rest, "-"); ok {
		r.def, r.hasDef = d, true
	}
	return r
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentByte(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// isIdent reports whether s is a shell or Python identifier.
func isIdent(s string) bool {
	if s == "" || !isIdentStart(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isIdentByte(s[i]) {
			return false
		}
	}
	return true
}

// isEnvName reports whether s looks like an environment variable name:
// upper case, as every variable the rules name is.
func isEnvName(s string) bool {
	if s == "" || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
			return false
		}
	}
	return true
}

// splitAssign splits NAME=value.
func splitAssign(s string) (name, value string, ok bool) {
	eq := strings.IndexByte(s, '=')
	if eq <= 0 || !isIdent(s[:eq]) {
		return "", "", false
	}
	return s[:eq], s[eq+1:], true
}
