package audit

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// words renders lexed commands as "text@line:col" per word, commands
// separated by " | ".
func words(res shResult) string {
	var cmds []string
	for _, ws := range res.cmds {
		var parts []string
		for _, w := range ws {
			parts = append(parts, fmt.Sprintf("%s@%d:%d", w.text, w.pos.Line, w.pos.Col))
		}
		cmds = append(cmds, strings.Join(parts, " "))
	}
	return strings.Join(cmds, " | ")
}

func TestLexShell(t *testing.T) {
	cases := []struct {
		name, src, want string
	}{
		{"plain", "a b  c", "a@1:1 b@1:3 c@1:6"},
		{"quotes", `a "b c" 'd e' f"g"'h'`, "a@1:1 b c@1:3 d e@1:9 fgh@1:15"},
		{"escapes", `a\ b "c\"d" 'e\f'`, `a b@1:1 c"d@1:6 e\f@1:13`},
		{"continuation", "a \\\n  b \\\n c", "a@1:1 b@2:3 c@3:2"},
		{"separators", "a; b && c | d & e\nf", "a@1:1 | b@1:4 | c@1:9 | d@1:13 | e@1:17 | f@2:1"},
		{"redirect kept", "a 2>&1 b", "a@1:1 2>&1@1:3 b@1:8"},
		{"expansions kept", `a "$X" ${Y:-z} $(cmd "x y") ` + "`q`", `a@1:1 $X@1:3 ${Y:-z}@1:8 $(cmd "x y")@1:16 ` + "`q`@1:29"},
		{"ansi quote", `a $'b\'c'`, "a@1:1 b'c@1:3"},
		{"comment", "a # b c\nd", "a@1:1 | d@2:1"},
		{"hash inside word", "a#b", "a#b@1:1"},
		{"unterminated", `a "b c`, "a@1:1 b c@1:3"},
		{"utf8 columns", "é b", "é@1:1 b@1:3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := words(lexShell(c.src, Pos{1, 1}, false)); got != c.want {
				t.Errorf("lexShell(%q)\ngot  %s\nwant %s", c.src, got, c.want)
			}
		})
	}
}

func TestLexShellFoldAndComments(t *testing.T) {
	res := lexShell("a\n  b # note\n", Pos{3, 5}, true)
	if got := words(res); got != "a@3:5 b@4:3" {
		t.Errorf("folded: %s", got)
	}
	if len(res.comments) != 1 || res.comments[0].text != "# note" || res.comments[0].pos != (Pos{4, 5}) {
		t.Errorf("comments: %+v", res.comments)
	}
}

func TestExpand(t *testing.T) {
	res := lexShell("P=1\nQ=a\nQ=b\nx $P${P} ${Q} ${R:-9} '$P' \"$P\"", Pos{1, 1}, false)
	vars := shellVars(res.cmds)
	var got []string
	for _, w := range res.cmds[3] {
		text, unresolved := expand(&w, vars)
		if unresolved {
			text += "?"
		}
		got = append(got, text)
	}
	want := []string{"x", "11", "${Q}?", "9", "$P", "1"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestLexPython(t *testing.T) {
	toks, notes := lexPython("x = f(a, r'\\d', b'''t\nu''', \"q\\\"\")  # c\n", nil)
	var got []string
	for _, tk := range toks {
		got = append(got, fmt.Sprintf("%d:%s@%d:%d", tk.kind, tk.text, tk.pos.Line, tk.pos.Col))
	}
	want := []string{"0:x@1:1", "3:=@1:3", "0:f@1:5", "3:(@1:6", "0:a@1:7", "3:,@1:8",
		`2:\d@1:10`, "3:,@1:15", "2:t\nu@1:17", "3:,@2:5", `2:q"@2:7`, "3:)@2:12", "4:\n@2:18"}
	if !slices.Equal(got, want) {
		t.Errorf("tokens\ngot  %q\nwant %q", got, want)
	}
	if len(notes) != 1 || notes[0].text != " c" || notes[0].pos != (Pos{2, 16}) {
		t.Errorf("comments: %+v", notes)
	}
}
