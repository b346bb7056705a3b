package audit

import "strings"

// A Python tokenizer just deep enough to find calls, keyword arguments,
// list and dict literals, subscripts, imports, strings and comments. It
// never fails; what it cannot read it passes over.

type pyKind uint8

const (
	pyName pyKind = iota
	pyNum
	pyStr
	pyOp
	pyNewline // end of a logical line
)

type pyTok struct {
	kind pyKind
	text string // strings decoded; everything else as written
	pos  Pos
	cpos Pos // strings: where the content starts
	// fexpr marks an f-string with a replacement field: its text holds
	// {expr} as written, not a value.
	fexpr bool
	// start and end are byte offsets of the token in the source.
	start, end int
}

type pyComment struct {
	text string
	pos  Pos
}

type pyLexer struct {
	shLexer // reuses position tracking
	depth   int
	toks    []pyTok
	notes   []pyComment
}

// lexPython appends src's tokens to toks[:0].
func lexPython(src string, toks []pyTok) ([]pyTok, []pyComment) {
	lx := &pyLexer{shLexer: shLexer{src: src, at: Pos{1, 1}}, toks: toks[:0]}
	for lx.i < len(src) {
		c := src[lx.i]
		switch {
		case c == '\n':
			if lx.depth == 0 {
				lx.emit(pyNewline, "\n", lx.pos(), lx.i, lx.i+1)
			}
			lx.adv()
		case c == ' ' || c == '\t' || c == '\r' || c == '\f':
			lx.adv()
		case c == '\\' && lx.peek(1) == '\n':
			lx.adv()
			lx.adv()
		case c == '#':
			sc := lx.comment()
			lx.notes = append(lx.notes, pyComment{text: sc.text[1:], pos: Pos{sc.pos.Line, sc.pos.Col + 1}})
		case c == '"' || c == '\'':
			lx.str(lx.i, lx.pos(), false, false)
		case isIdentStart(c) || c >= 0x80:
			lx.nameOrPrefixedString()
		case c >= '0' && c <= '9' || (c == '.' && lx.peek(1) >= '0' && lx.peek(1) <= '9'):
			p, start := lx.pos(), lx.i
			for lx.i < len(src) && (isIdentByte(src[lx.i]) || src[lx.i] == '.') {
				lx.adv()
			}
			lx.emit(pyNum, src[start:lx.i], p, start, lx.i)
		default:
			lx.op()
		}
	}
	return lx.toks, lx.notes
}

func (lx *pyLexer) emit(k pyKind, text string, p Pos, start, end int) {
	lx.toks = append(lx.toks, pyTok{kind: k, text: text, pos: p, start: start, end: end})
}

func (lx *pyLexer) op() {
	p, start := lx.pos(), lx.i
	c := lx.src[lx.i]
	lx.adv()
	next := lx.peek(0)
	switch {
	case next == '=' && strings.IndexByte("=!<>:+-*/%&|^@", c) >= 0:
		lx.adv()
	case c == '*' && next == '*', c == '-' && next == '>':
		lx.adv()
	}
	switch c {
	case '(', '[', '{':
		lx.depth++
	case ')', ']', '}':
		if lx.depth > 0 {
			lx.depth--
		}
	}
	lx.emit(pyOp, lx.src[start:lx.i], p, start, lx.i)
}

func (lx *pyLexer) nameOrPrefixedString() {
	p, start := lx.pos(), lx.i
	for lx.i < len(lx.src) && (isIdentByte(lx.src[lx.i]) || lx.src[lx.i] >= 0x80) {
		lx.adv()
	}
	name := lx.src[start:lx.i]
	if q := lx.peek(0); (q == '"' || q == '\'') && len(name) <= 2 && strings.Trim(strings.ToLower(name), "rbuf") == "" {
		lx.str(start, p, strings.ContainsAny(name, "rR"), strings.ContainsAny(name, "fF"))
		return
	}
	lx.emit(pyName, name, p, start, lx.i)
}

// str reads a string literal whose prefix (if any) started at start.
func (lx *pyLexer) str(start int, p Pos, raw, fstr bool) {
	q := lx.src[lx.i]
	triple := lx.peek(1) == q && lx.peek(2) == q
	n := 1
	if triple {
		n = 3
	}
	for range n {
		lx.adv()
	}
	cpos := lx.pos()
	var b strings.Builder
	fexpr := false
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		if fstr && c == '{' {
			if lx.peek(1) == '{' {
				b.WriteByte('{')
				lx.adv()
				lx.adv()
				continue
			}
			fexpr = true
			lx.field(&b)
			continue
		}
		if c == q && (!triple || (lx.peek(1) == q && lx.peek(2) == q)) {
			for range n {
				lx.adv()
			}
			break
		}
		if c == '\n' && !triple {
			break // unterminated: stop at the line's end
		}
		if c == '\\' && lx.i+1 < len(lx.src) {
			lx.adv()
			lx.escape(&b, raw)
			continue
		}
		b.WriteByte(c)
		lx.adv()
	}
	lx.toks = append(lx.toks, pyTok{kind: pyStr, text: b.String(), pos: p, cpos: cpos, start: start, end: lx.i, fexpr: fexpr})
}

// field copies an f-string replacement field {expr!r:fmt} as written.
// Quotes inside it (f"{cfg["model"]}", Python 3.12) do not end the string.
func (lx *pyLexer) field(b *strings.Builder) {
	depth := 0
	var quote byte
	for lx.i < len(lx.src) {
		c := lx.src[lx.i]
		b.WriteByte(c)
		lx.adv()
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '{' || c == '[' || c == '(':
			depth++
		case c == '}' || c == ']' || c == ')':
			if depth--; depth == 0 {
				return
			}
		case c == '\n':
			return // unterminated: let the string end where it can
		}
	}
}

// escape decodes the common escapes after a backslash; the rest are kept.
func (lx *pyLexer) escape(b *strings.Builder, raw bool) {
	e := lx.src[lx.i]
	lx.adv()
	if raw {
		b.WriteByte('\\')
		b.WriteByte(e)
		return
	}
	switch e {
	case '\n':
	case 'n':
		b.WriteByte('\n')
	case 't':
		b.WriteByte('\t')
	case '\\', '\'', '"':
		b.WriteByte(e)
	default:
		b.WriteByte('\\')
		b.WriteByte(e)
	}
}
