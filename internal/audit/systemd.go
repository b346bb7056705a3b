package audit

import (
	"strings"
)

// execKeys run a command line.
var execKeys = map[string]bool{
	"ExecStart": true, "ExecStartPre": true, "ExecStartPost": true, "ExecReload": true,
	"ExecStop": true, "ExecStopPost": true, "ExecCondition": true,
}

// parseUnit reads a systemd unit: Exec* command lines (with backslash
// continuations), Environment=, UnsetEnvironment=, PassEnvironment= and
// EnvironmentFile= references. Lines systemd would reject are a problem and
// the file is skipped.
func parseUnit(src string, f *facts) error {
	lines := strings.Split(src, "\n")
	section := ""
	for i := 0; i < len(lines); i++ {
		line := strings.TrimRight(lines[i], " \t\r")
		trimmed := strings.TrimLeft(line, " \t")
		lead := len(line) - len(trimmed)
		switch {
		case trimmed == "":
			continue
		case trimmed[0] == '#' || trimmed[0] == ';':
			f.addComment(trimmed[1:], Pos{i + 1, lead + 2}, 0)
			continue
		case trimmed[0] == '[':
			if !strings.HasSuffix(trimmed, "]") {
				return &problem{Pos{i + 1, lead + 1}, "malformed unit: section header without ]"}
			}
			section = trimmed[1 : len(trimmed)-1]
			continue
		}
		eq := strings.IndexByte(trimmed, '=')
		if eq <= 0 {
			return &problem{Pos{i + 1, lead + 1}, "malformed unit: expected Key=Value"}
		}
		if section == "" {
			return &problem{Pos{i + 1, lead + 1}, "malformed unit: assignment outside a [section]"}
		}
		key := strings.TrimSpace(trimmed[:eq])
		// The value runs on while lines end in a backslash.
		last := i
		for last+1 < len(lines) && strings.HasSuffix(strings.TrimRight(lines[last], " \t\r"), "\\") {
			last++
		}
		startCol := lead + eq + 2
		value := strings.Join(append([]string{trimmed[eq+1:]}, lines[i+1:last+1]...), "\n")
		unitValue(f, key, value, Pos{i + 1, startCol})
		i = last
	}
	return nil
}

func unitValue(f *facts, key, value string, p Pos) {
	switch {
	case execKeys[key]:
		res := lexShell(value, p, false)
		for _, ws := range res.cmds {
			// Prefixes such as - @ + ! : change how systemd runs the
			// command, not what it runs.
			if len(ws) > 0 {
				ws[0].text = strings.TrimLeft(ws[0].text, "-@+!:|")
			}
		}
		f.addShell(res, false, 0)
	case key == "Environment":
		for _, ws := range lexShell(value, p, true).cmds {
			for _, w := range ws {
				if name, val, ok := splitAssign(w.text); ok {
					f.env(name, val, true, w.pos, false)
				}
			}
		}
	case key == "UnsetEnvironment" || key == "PassEnvironment":
		for _, ws := range lexShell(value, p, true).cmds {
			for _, w := range ws {
				name, _, ok := splitAssign(w.text)
				if !ok {
					name = w.text
				}
				if isIdent(name) {
					f.env(name, "", false, w.pos, false)
				}
			}
		}
	case key == "EnvironmentFile":
		path := strings.TrimSpace(value)
		f.EnvFiles = append(f.EnvFiles, ref{Path: strings.TrimPrefix(path, "-"), Pos: p})
	}
}
