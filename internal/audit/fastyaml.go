package audit

import (
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// fastYAML reads the block YAML that deploy files are written in straight
// into the yaml.Node trees yaml.v3 builds, several times faster than
// yaml.v3 (whose parse was most of the audit's time). Anything outside
// that subset (anchors, aliases, tags, directives, complex keys, plain,
// quoted or flow scalars over several lines, tabs in indentation, empty
// documents) answers ok=false, and the file goes to yaml.v3, which is also
// the judge of what is malformed. TestFastYAMLMatchesYAMLv3 holds the two
// to the same trees. It still pays (2 shared cores, November 2026): with
// yaml.v3 alone the audit took 1.81 to 2.67 times grep's time on the
// generated 10,000-file tree (BenchmarkAuditVsGrep, target 2), against
// 1.22 to 1.50 with it; on the realistic tree, where 5% of files are
// parsed, 0.76 to 1.06 against 0.63 to 0.77.
func fastYAML(src []byte, slab []yaml.Node) (docs []*yaml.Node, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, fell := r.(fyFallback); !fell {
				panic(r)
			}
			docs, ok = nil, false
		}
	}()
	p := newFY(string(src))
	defer lineSlabs.put(p.lines)
	p.nodes = slab
	for {
		p.skipBlank()
		if p.eof() {
			break
		}
		if l := p.cur(); l.indent == 0 && strings.HasPrefix(l.text, "---") {
			if strings.TrimRight(l.text, " ") != "---" {
				p.fallback()
			}
			p.i++
			p.skipBlank()
			if p.eof() {
				p.fallback()
			}
		}
		root := p.node(-1)
		docs = append(docs, &yaml.Node{Kind: yaml.DocumentNode, Line: root.Line, Column: 1, Content: []*yaml.Node{root}})
		if p.skipBlank(); !p.eof() && !strings.HasPrefix(p.cur().text, "---") {
			p.fallback() // more content after the root node ended
		}
	}
	return docs, len(docs) > 0
}

type fyFallback struct{}

var lineSlabs slabPool[fyLine]

type fyLine struct {
	text   string
	indent int  // leading spaces
	blank  bool // nothing but spaces, tabs or a comment
}

type fyParser struct {
	lines []fyLine
	i     int
	// nodes holds the tree: a file has many small nodes, allocated in
	// chunks, the first one lent by the caller.
	nodes []yaml.Node
	// finalNL: the text ends with a line break, which a block scalar that
	// runs to the end keeps.
	finalNL bool
}

func newFY(src string) *fyParser {
	p := &fyParser{lines: lineSlabs.get(strings.Count(src, "\n") + 1), finalNL: strings.HasSuffix(src, "\n")}
	for line := range strings.SplitSeq(src, "\n") {
		line = strings.TrimSuffix(line, "\r")
		ind := 0
		for ind < len(line) && line[ind] == ' ' {
			ind++
		}
		rest := strings.TrimLeft(line[ind:], " \t")
		blank := rest == "" || rest[0] == '#'
		if !blank && (line[ind] == '\t' || strings.ContainsAny(line, "\r\t")) {
			p.fallback() // tabs: yaml.v3 decides
		}
		if ind == 0 && (strings.HasPrefix(line, "%") || strings.HasPrefix(line, "...") || strings.HasPrefix(line, "\ufeff")) {
			p.fallback()
		}
		p.lines = append(p.lines, fyLine{text: line, indent: ind, blank: blank})
	}
	return p
}

func (p *fyParser) fallback() { panic(fyFallback{}) }

func (p *fyParser) newNode(kind yaml.Kind, tag string, style yaml.Style, value string, line, col int) *yaml.Node {
	if len(p.nodes) == cap(p.nodes) {
		p.nodes = make([]yaml.Node, 0, 32)
	}
	p.nodes = append(p.nodes, yaml.Node{Kind: kind, Tag: tag, Style: style, Value: value, Line: line, Column: col})
	return &p.nodes[len(p.nodes)-1]
}
func (p *fyParser) eof() bool    { return p.i >= len(p.lines) }
func (p *fyParser) cur() *fyLine { return &p.lines[p.i] }

func (p *fyParser) skipBlank() {
	for p.i < len(p.lines) && p.lines[p.i].blank {
		p.i++
	}
}

// atEnd reports whether the current line is less indented than n or
// starts the next document.
func (p *fyParser) atEnd(n int) bool {
	l := p.cur()
	return l.indent < n || l.indent == 0 && (l.text == "---" || strings.HasPrefix(l.text, "--- "))
}

// col is the 1-based column, in characters, of byte i of the current line.
func (p *fyParser) col(i int) int { return utf8.RuneCountInString(p.cur().text[:i]) + 1 }

// node reads the block node starting on the current line, which is
// indented more than parent.
func (p *fyParser) node(parent int) *yaml.Node {
	l := p.cur()
	rest := l.text[l.indent:]
	switch {
	case isSeqEntry(rest):
		return p.sequence(l.indent)
	case mapKeyEnd(rest) > 0:
		return p.mapping(l.indent)
	}
	p.fallback() // a document or value that is a bare scalar
	return nil
}

func isSeqEntry(s string) bool { return s == "-" || strings.HasPrefix(s, "- ") }

func (p *fyParser) mapping(n int) *yaml.Node {
	m := p.newNode(yaml.MappingNode, "!!map", 0, "", p.i+1, p.col(n))
	for p.skipBlank(); !p.eof(); p.skipBlank() {
		if p.atEnd(n) {
			break
		}
		l := p.cur()
		end := mapKeyEnd(l.text[n:])
		if l.indent > n || end <= 0 {
			p.fallback()
		}
		key := p.scalarAt(l.text[n:end+n-1], n)
		m.Content = append(m.Content, key, p.value(n, n+end))
	}
	return m
}

// mapKeyEnd returns the offset just after the ':' of a "key:" entry, or 0
// when s is not one this parser reads.
func mapKeyEnd(s string) int {
	if s == "" || strings.IndexByte("[]{}#&*!|>%@`,?", s[0]) >= 0 || isSeqEntry(s) {
		return 0
	}
	if s[0] == '"' || s[0] == '\'' {
		if end := quotedEnd(s, 0); end > 0 && end < len(s) && s[end] == ':' && (end+1 == len(s) || s[end+1] == ' ') {
			return end + 1
		}
		return 0
	}
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '#' && i > 0 && s[i-1] == ' ':
			return 0
		case s[i] == ':' && (i+1 == len(s) || s[i+1] == ' '):
			if strings.TrimRight(s[:i], " ") != s[:i] {
				return 0 // "key :" is valid YAML, but not ours
			}
			return i + 1
		}
	}
	return 0
}

// value reads what follows a key's ':' at byte off of the current line.
func (p *fyParser) value(n, off int) *yaml.Node {
	l := p.cur()
	v := strings.TrimLeft(l.text[off:], " ")
	if v == "" || v[0] == '#' {
		null := p.newNode(yaml.ScalarNode, "!!null", 0, "", p.i+1, p.col(off))
		p.i++
		if p.skipBlank(); p.eof() {
			return null
		}
		next := p.cur()
		switch {
		case next.indent > n:
			return p.node(n)
		case next.indent == n && isSeqEntry(next.text[n:]):
			return p.sequence(n)
		}
		return null
	}
	return p.inline(len(l.text)-len(v), n)
}

func (p *fyParser) sequence(n int) *yaml.Node {
	s := p.newNode(yaml.SequenceNode, "!!seq", 0, "", p.i+1, p.col(n))
	for p.skipBlank(); !p.eof(); p.skipBlank() {
		if p.atEnd(n) {
			break
		}
		l := p.cur()
		if l.indent > n {
			p.fallback()
		}
		if !isSeqEntry(l.text[n:]) {
			break // the next key of the mapping this sequence is a value in
		}
		at := n + 1
		for at < len(l.text) && l.text[at] == ' ' {
			at++
		}
		content := l.text[at:]
		switch {
		case content == "" || content[0] == '#':
			// The item is on the lines below, or empty: unlike a key's
			// value, a "-" at this indentation is the next item.
			null := p.newNode(yaml.ScalarNode, "!!null", 0, "", p.i+1, p.col(n+1))
			p.i++
			if p.skipBlank(); !p.eof() && p.cur().indent > n {
				null = p.node(n)
			}
			s.Content = append(s.Content, null)
		case isSeqEntry(content):
			p.fallback()
		case mapKeyEnd(content) > 0:
			// "- key: value" starts a mapping whose keys line up after the dash.
			p.lines[p.i] = fyLine{text: l.text[:n] + " " + l.text[n+1:], indent: at}
			s.Content = append(s.Content, p.mapping(at))
		default:
			s.Content = append(s.Content, p.inline(at, n))
		}
	}
	return s
}

// inline reads a value that starts at byte at of the current line: a
// block scalar header, a flow collection, a quoted or a plain scalar.
func (p *fyParser) inline(at, n int) *yaml.Node {
	text := p.cur().text
	var node *yaml.Node
	end := len(text)
	switch text[at] {
	case '|', '>':
		return p.block(at, n)
	case '[', '{':
		node, end = p.flow(text, at)
	case '"', '\'':
		end = quotedEnd(text, at)
		if end < 0 {
			p.fallback()
		}
		node = p.quoted(text[at:end], at)
	case '&', '*', '!', '%', '@', '`', '?', ']', '}', ',', '#':
		p.fallback()
	default:
		plain := text[at:]
		if i := strings.Index(plain, " #"); i >= 0 {
			plain = plain[:i]
		}
		plain = strings.TrimRight(plain, " ")
		if isSeqEntry(plain) || strings.Contains(plain, ": ") || strings.HasSuffix(plain, ":") {
			p.fallback()
		}
		node = p.scalarAt(plain, at)
		end = at + len(plain)
	}
	if rest := strings.TrimLeft(text[end:], " "); rest != "" && rest[0] != '#' {
		p.fallback()
	}
	p.i++
	// A more indented line now would continue a multi-line scalar.
	if p.skipBlank(); !p.eof() && p.cur().indent > n {
		p.fallback()
	}
	return node
}

// scalarAt makes a plain scalar (or a key) starting at byte at. Its tag
// is left to yaml.Node.ShortTag, which resolves it when asked, as the
// audit rarely does.
func (p *fyParser) scalarAt(text string, at int) *yaml.Node {
	if text[0] == '"' || text[0] == '\'' {
		return p.quoted(text, at)
	}
	return p.newNode(yaml.ScalarNode, "", 0, text, p.i+1, p.col(at))
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

var dqEscapes = strings.NewReplacer(`\\`, `\`, `\"`, `"`, `\/`, `/`, `\n`, "\n", `\t`, "\t", `\r`, "\r")

func (p *fyParser) quoted(q string, at int) *yaml.Node {
	body := q[1 : len(q)-1]
	style := yaml.SingleQuotedStyle
	if q[0] == '"' {
		style = yaml.DoubleQuotedStyle
		for i := 0; i < len(body); i++ {
			if body[i] == '\\' {
				if i+1 >= len(body) || strings.IndexByte(`\"/ntr`, body[i+1]) < 0 {
					p.fallback() // an escape this parser does not decode
				}
				i++
			}
		}
		body = dqEscapes.Replace(body)
	} else {
		body = strings.ReplaceAll(body, "''", "'")
	}
	return p.newNode(yaml.ScalarNode, "!!str", style, body, p.i+1, p.col(at))
}

// flow reads a one-line flow collection starting at byte i of s.
func (p *fyParser) flow(s string, i int) (*yaml.Node, int) {
	node := p.newNode(yaml.SequenceNode, "!!seq", yaml.FlowStyle, "", p.i+1, p.col(i))
	closer := byte(']')
	if s[i] == '{' {
		node.Kind, node.Tag, closer = yaml.MappingNode, "!!map", '}'
	}
	i++
	for {
		i = skipSpaces(s, i)
		if i >= len(s) {
			p.fallback() // continues on the next line
		}
		if s[i] == closer {
			return node, i + 1
		}
		var item *yaml.Node
		item, i = p.flowItem(s, i, node.Kind == yaml.MappingNode)
		node.Content = append(node.Content, item)
		if node.Kind == yaml.MappingNode {
			if i = skipSpaces(s, i); i >= len(s) || s[i] != ':' {
				p.fallback()
			}
			item, i = p.flowItem(s, skipSpaces(s, i+1), false)
			node.Content = append(node.Content, item)
		}
		if i = skipSpaces(s, i); i < len(s) && s[i] == ',' {
			i++
		} else if i >= len(s) || s[i] != closer {
			p.fallback()
		}
	}
}

func (p *fyParser) flowItem(s string, i int, key bool) (*yaml.Node, int) {
	if i >= len(s) {
		p.fallback()
	}
	switch s[i] {
	case '[', '{':
		return p.flow(s, i)
	case '"', '\'':
		end := quotedEnd(s, i)
		if end < 0 {
			p.fallback()
		}
		return p.quoted(s[i:end], i), end
	case '&', '*', '!', '%', '@', '`', '?', '#', ',', ']', '}', ':', '|', '>':
		p.fallback()
	}
	j := i
	for j < len(s) && strings.IndexByte(",[]{}#", s[j]) < 0 && !(s[j] == ':' && (key || j+1 == len(s) || strings.IndexByte(" ,]}", s[j+1]) >= 0)) {
		j++
	}
	if j < len(s) && s[j] == ':' && !key {
		p.fallback() // a key: value pair inside a flow sequence
	}
	plain := strings.TrimRight(s[i:j], " ")
	if plain == "" || strings.Contains(plain, ": ") || isSeqEntry(plain) {
		p.fallback()
	}
	return p.scalarAt(plain, i), i + len(plain)
}

func skipSpaces(s string, i int) int {
	for i < len(s) && s[i] == ' ' {
		i++
	}
	return i
}

// block reads a | or > scalar whose header is at byte at of the current
// line and whose content is indented more than n.
func (p *fyParser) block(at, n int) *yaml.Node {
	header := p.cur().text[at:]
	if i := strings.Index(header, " #"); i >= 0 {
		header = header[:i]
	}
	header = strings.TrimRight(header, " ")
	if len(header) > 2 || len(header) == 2 && header[1] != '-' && header[1] != '+' {
		p.fallback() // an indentation indicator
	}
	node := p.newNode(yaml.ScalarNode, "!!str", yaml.LiteralStyle, "", p.i+1, p.col(at))
	if header[0] == '>' {
		node.Style = yaml.FoldedStyle
	}
	var lines []string
	indent := -1
	for p.i++; !p.eof(); p.i++ {
		raw := p.cur().text
		if strings.Trim(raw, " ") == "" {
			if indent < 0 && len(raw) > 0 || len(raw) > indent && indent >= 0 {
				p.fallback() // spaces that are content, or an error
			}
			lines = append(lines, "")
			continue
		}
		ind := len(raw) - len(strings.TrimLeft(raw, " "))
		if raw[ind] == '\t' {
			p.fallback()
		}
		if indent < 0 {
			if ind <= n || len(lines) > 0 {
				p.fallback() // empty, or led by blank lines
			}
			indent = ind
		}
		if ind < indent {
			break
		}
		lines = append(lines, raw[indent:])
	}
	if indent < 0 || p.eof() && !p.finalNL {
		p.fallback()
	}
	node.Value = blockValue(lines, node.Style == yaml.FoldedStyle, header)
	if node.Style == yaml.FoldedStyle && strings.Contains(strings.Join(lines, "\n"), "\n ") {
		p.fallback() // more-indented lines fold differently
	}
	return node
}

// blockValue joins block scalar lines and applies the chomping indicator.
func blockValue(lines []string, folded bool, header string) string {
	trailing := 0
	for trailing < len(lines) && lines[len(lines)-1-trailing] == "" {
		trailing++
	}
	body := lines[:len(lines)-trailing]
	var b strings.Builder
	for i, l := range body {
		switch {
		case i == 0:
		case !folded || l == "":
			b.WriteByte('\n')
		case body[i-1] != "":
			b.WriteByte(' ')
		}
		b.WriteString(l)
	}
	switch {
	case strings.HasSuffix(header, "-"):
	case strings.HasSuffix(header, "+"):
		b.WriteString(strings.Repeat("\n", trailing+1))
	default:
		b.WriteByte('\n')
	}
	return b.String()
}
