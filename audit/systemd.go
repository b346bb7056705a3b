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
// EnvironmentFile= references. systemd logs a malformed line and ignores
// it, and so does this: the line is a note and the rest is audited.
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
			// A commented-out ExecStart=: its command line, as a note.
			text, col := trimmed[1:], lead+2
			if k, v, ok := strings.Cut(text, "="); ok && execKeys[strings.TrimSpace(k)] {
				text, col = v, col+len(k)+1
			}
			f.addComment(text, Pos{i + 1, col}, 0)
			continue
		case trimmed[0] == '[':
			if !strings.HasSuffix(trimmed, "]") {
				f.Notes = append(f.Notes, problem{Pos{i + 1, lead + 1}, "malformed unit line: section header without ]"})
				section = strings.TrimPrefix(trimmed, "[")
				continue
			}
			section = trimmed[1 : len(trimmed)-1]
			continue
		}
		eq := strings.IndexByte(trimmed, '=')
		if eq <= 0 {
			f.Notes = append(f.Notes, problem{Pos{i + 1, lead + 1}, "malformed unit line: expected Key=Value; systemd ignores it"})
			continue
		}
		if section == "" {
			f.Notes = append(f.Notes, problem{Pos{i + 1, lead + 1}, "malformed unit line: assignment outside a [section]; systemd ignores it"})
			continue
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
		// systemd runs one command line, not a shell script: ; and
		// quotes split it much as sh does, and prefixes such as - @ + !
		// change how it runs, not what.
		for _, ws := range lexShell(value, p, true).cmds {
			words := make([]Word, 0, len(ws))
			for j := range ws {
				text := ws[j].text
				if j == 0 {
					text = strings.TrimLeft(text, "-@+!:|")
				}
				words = append(words, Word{Text: text, Pos: ws[j].pos, Quoted: ws[j].quoted})
			}
			f.command(words, false, 0)
		}
	case key == "Environment":
		for _, ws := range lexShell(value, p, true).cmds {
			for _, w := range ws {
				if name, val, ok := splitAssign(w.text); ok {
					f.setEnv(name, val, true, w.pos, false, -1)
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
				if !isIdent(name) {
					continue
				}
				if key == "PassEnvironment" {
					f.setEnv(name, "", false, w.pos, false, -1) // passed on from the manager
				} else {
					f.mentionEnv(name, w.pos, false)
				}
			}
		}
	case key == "EnvironmentFile":
		path := strings.TrimSpace(value)
		f.EnvFiles = append(f.EnvFiles, ref{Path: strings.TrimPrefix(path, "-"), Pos: p})
	}
}
