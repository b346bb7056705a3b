package audit

import (
	"bytes"
	"strings"

	"go.yaml.in/yaml/v3"
)

// scalarText is a flow scalar's text and where it starts. One written over
// several lines is read from the source as written, so that a flag on its
// third line is placed there; YAML folds its line breaks to spaces, which
// a shell lexer treats alike.
func (w *yamlWalker) scalarText(n *yaml.Node) (string, Pos) {
	at := pos(n)
	quoted := n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0
	if quoted {
		at.Col++
	}
	if !strings.ContainsAny(n.Value, " \t") || n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return n.Value, at
	}
	if w.lines == nil {
		w.lines = bytes.Split(w.src, []byte("\n"))
	}
	if n.Line < 1 || n.Line > len(w.lines) {
		return n.Value, at
	}
	first := string(w.lines[n.Line-1])
	off := byteOffset(first, at.Col-1)
	if off < 0 || n.Line == len(w.lines) {
		return n.Value, at
	}
	rest := first[off:]
	if quoted {
		q := byte('"')
		if n.Style&yaml.SingleQuotedStyle != 0 {
			q = '\''
		}
		if end := quotedEnd(string(q)+rest, 0); end > 0 {
			return n.Value, at // closes on its first line
		}
	} else if strings.HasPrefix(n.Value, strings.TrimRight(rest, " ")) && len(strings.TrimRight(rest, " ")) == len(n.Value) {
		return n.Value, at
	}
	// Several lines: the source from the scalar to where its value ends.
	var b strings.Builder
	b.WriteString(rest)
	for l := n.Line; l < len(w.lines) && !folded(b.String(), n); l++ {
		b.WriteByte('\n')
		b.Write(w.lines[l])
	}
	text := b.String()
	if quoted {
		if q := strings.LastIndexAny(text, `"'`); q >= 0 {
			text = text[:q]
		}
	}
	return text, at
}

// folded reports whether text, as written, already holds all of n's words.
func folded(text string, n *yaml.Node) bool {
	return len(strings.Fields(text)) >= len(strings.Fields(n.Value))
}

// byteOffset is the byte offset of the col-th code point of s, or -1.
func byteOffset(s string, col int) int {
	for i := range s {
		if col == 0 {
			return i
		}
		col--
	}
	if col == 0 {
		return len(s)
	}
	return -1
}

// blockText is a block scalar's text as it stands in the file, indentation
// included, so that shell words keep their real columns.
func (w *yamlWalker) blockText(n *yaml.Node) (string, int) {
	if w.lines == nil {
		w.lines = bytes.Split(w.src, []byte("\n"))
	}
	first := n.Line // 1-based line of the indicator; content starts below
	indent := -1
	end := first
	for i := first; i < len(w.lines); i++ {
		line := w.lines[i]
		trimmed := bytes.TrimLeft(line, " ")
		if len(bytes.TrimSpace(line)) == 0 {
			end = i + 1
			continue
		}
		ind := len(line) - len(trimmed)
		if indent < 0 {
			indent = ind
		}
		if ind < indent {
			break
		}
		end = i + 1
	}
	if end <= first {
		return "", first + 1
	}
	return string(bytes.Join(w.lines[first:end], []byte("\n"))), first + 1
}

// quotedEnd returns the offset just after the quoted scalar at i, or -1.
func quotedEnd(s string, i int) int {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case q == '"' && s[j] == '\\':
			j++
		case s[j] == q && q == '\'' && j+1 < len(s) && s[j+1] == '\'':
			j++
		case s[j] == q:
			return j + 1
		}
	}
	return -1
}
