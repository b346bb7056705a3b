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
	// Quoted marks a word written in quotes: its content starts one
	// column after Pos.
	Quoted bool
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
	recog
	// Scope is the script, unit, container, compose service or image
	// stage the command runs in: checks pair settings only within one.
	Scope int
}

// EnvUse is one place an environment variable is set, passed or read.
type EnvUse struct {
	Name     string
	Value    string
	HasValue bool
	Pos      Pos
	Comment  bool
	// Set is true where the variable is given a value or passed on
	// (NAME=value, export, ENV, Environment=, an env entry); a read or
	// any other mention is only a note.
	Set bool
	// Scope is as for Command; Cmd is the index of the one command the
	// variable is given to (NAME=value cmd, docker -e), or -1 for every
	// command of the scope.
	Scope, Cmd int
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
	// Notes are lines the file's own program ignores (a malformed unit
	// line): reported as notes, the rest of the file is audited.
	Notes []problem
	// scope is the scope new commands and variables go to; scopes counts
	// those handed out.
	scope, scopes int
	// words backs the Words of shell commands, reused from file to file.
	words []Word
}

func (f *facts) reset() {
	f.Commands, f.Env, f.Keys, f.Modules, f.EnvFiles = f.Commands[:0], f.Env[:0], f.Keys[:0], f.Modules[:0], f.EnvFiles[:0]
	f.Notes, f.scope, f.scopes = f.Notes[:0], 0, 0
	f.words = f.words[:0]
}

// newScope starts a scope (a container, a service, an image stage) and
// returns the one to restore when it ends.
func (f *facts) newScope() (prev int) {
	prev = f.scope
	f.scopes++
	f.scope = f.scopes
	return prev
}

// problem is a reason a file could not be parsed; the file is then skipped.
type problem struct {
	Pos Pos
	Msg string
}

func (p *problem) Error() string { return p.Msg }
