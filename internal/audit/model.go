package audit

// Pos is a place in a file: 1-based line and column, columns counted in
// Unicode code points so that editors and SARIF viewers agree.
type Pos struct{ Line, Col int }

// step moves p over byte c: a line end starts the next line; bytes that
// continue a UTF-8 character do not move the column.
func (p Pos) step(c byte) Pos {
	switch {
	case c == '\n':
		return Pos{p.Line + 1, 1}
	case c&0xC0 != 0x80:
		p.Col++
	}
	return p
}

// Word is one argument after quote removal and, for shell, expansion of
// variables the same file assigns.
type Word struct {
	Text string
	Pos  Pos
	// Opaque marks a word whose value is not a literal (a Python expression),
	// so value conditions must not match it.
	Opaque bool
}

// Command is one argument list as the program would receive it: a shell
// command line, an exec-form array, a YAML args list, or a Python call's
// keyword arguments and a dict's entries rewritten as --flag=value words.
type Command struct {
	Words   []Word
	Comment bool
}

// EnvUse is one place an environment variable is set, passed or read.
type EnvUse struct {
	Name     string
	Value    string
	HasValue bool
	Pos      Pos
	Comment  bool
}

// Mention is a name seen as a request key or a module path.
type Mention struct {
	Name    string
	Pos     Pos
	Comment bool
	// Call is the function whose keyword argument this is, if any: engine
	// constructors take keys that are not per-request.
	Call string
}

// ref is an environment file a unit or compose file reads at run time.
type ref struct {
	Path string
	Pos  Pos
	// Dir is the directory relative references resolve against.
	Dir string
}

// facts is everything the rules look at in one file, whatever its kind.
type facts struct {
	Commands []Command
	Env      []EnvUse
	Keys     []Mention
	Modules  []Mention
	EnvFiles []ref
	// words backs the Words of shell commands, reused from file to file.
	words []Word
}

func (f *facts) reset() {
	f.Commands, f.Env, f.Keys, f.Modules, f.EnvFiles = f.Commands[:0], f.Env[:0], f.Keys[:0], f.Modules[:0], f.EnvFiles[:0]
	f.words = f.words[:0]
}

// problem is a reason a file could not be parsed; the file is then skipped.
type problem struct {
	Pos Pos
	Msg string
}

func (p *problem) Error() string { return p.Msg }
