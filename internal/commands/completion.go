package commands

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
)

func init() {
	register(command{
		name:    "completion",
		summary: "print a shell completion script (bash, zsh or fish)",
		usage:   "completion bash|zsh|fish",
		examples: []string{
			"source <(weightcache completion bash)",
			"weightcache completion bash > /etc/bash_completion.d/weightcache",
			"weightcache completion zsh > \"${fpath[1]}/_weightcache\"",
			"weightcache completion fish > ~/.config/fish/completions/weightcache.fish",
		},
		run: runCompletion,
	})
}

// The scripts are generated from the commands' own flag sets, so a flag added
// to a command completes without touching this file.
func runCompletion(ctx context.Context, e env, args []string) error {
	fs := newFlags("completion", e)
	if err := parseFlags(fs, args, true); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageErrorf("want one shell: bash, zsh or fish")
	}
	switch fs.Arg(0) {
	case "bash":
		writeBash(e.stdout)
	case "zsh":
		// zsh runs the bash script through bashcompinit.
		fmt.Fprintln(e.stdout, "#compdef weightcache\nautoload -U +X bashcompinit && bashcompinit")
		writeBash(e.stdout)
	case "fish":
		writeFish(e.stdout)
	default:
		return usageErrorf("shell %q: want bash, zsh or fish", fs.Arg(0))
	}
	return nil
}

// completionFlags lists a command's flags as --name, with "=" appended to
// none: every flag takes its value as the next word or after "=".
func completionFlags(c command) (all, files, dirs []string) {
	commandFlags(c).VisitAll(func(f *flag.Flag) {
		all = append(all, "--"+f.Name)
		switch f.Name {
		case "model", "draft-model", "out", "socket-dir":
			dirs = append(dirs, "--"+f.Name)
		case "sharding-plan", "draft-sharding-plan", "rules":
			files = append(files, "--"+f.Name)
		}
	})
	return all, files, dirs
}

func writeBash(w io.Writer) {
	fmt.Fprint(w, `# bash completion for weightcache (weightcache completion bash)
_weightcache() {
    local cur prev cmd
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    cmd="${COMP_WORDS[1]}"
    if [ "$COMP_CWORD" -eq 1 ]; then
`)
	fmt.Fprintf(w, "        COMPREPLY=($(compgen -W %q -- \"$cur\"))\n        return\n    fi\n", strings.Join(append(visibleCommands(), "help", "--help", "--version"), " "))
	fmt.Fprint(w, "    case \"$cmd\" in\n")
	for _, n := range visibleCommands() {
		all, files, dirs := completionFlags(registry[n])
		fmt.Fprintf(w, "    %s)\n", n)
		if len(dirs) > 0 {
			fmt.Fprintf(w, "        case \"$prev\" in %s) COMPREPLY=($(compgen -d -- \"$cur\")); return;; esac\n", strings.Join(dirs, "|"))
		}
		if len(files) > 0 {
			fmt.Fprintf(w, "        case \"$prev\" in %s) COMPREPLY=($(compgen -f -- \"$cur\")); return;; esac\n", strings.Join(files, "|"))
		}
		switch n {
		case "completion":
			fmt.Fprint(w, "        COMPREPLY=($(compgen -W \"bash zsh fish\" -- \"$cur\"));;\n")
		case "help":
		default:
			fmt.Fprintf(w, "        COMPREPLY=($(compgen -W %q -- \"$cur\"));;\n", strings.Join(append(all, "--help"), " "))
		}
	}
	fmt.Fprint(w, "    help) COMPREPLY=($(compgen -W \""+strings.Join(visibleCommands(), " ")+"\" -- \"$cur\"));;\n")
	fmt.Fprint(w, "    esac\n}\ncomplete -o default -F _weightcache weightcache\n")
}

func writeFish(w io.Writer) {
	names := visibleCommands()
	fmt.Fprintln(w, "# fish completion for weightcache (weightcache completion fish)")
	fmt.Fprintf(w, "complete -c weightcache -f -n __fish_use_subcommand -a %q\n", strings.Join(append(names, "help"), " "))
	fmt.Fprintln(w, "complete -c weightcache -n __fish_use_subcommand -l version -d 'print the version'")
	for _, n := range names {
		c := registry[n]
		fmt.Fprintf(w, "complete -c weightcache -n __fish_use_subcommand -a %s -d %q\n", n, c.summary)
		commandFlags(c).VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(w, "complete -c weightcache -n '__fish_seen_subcommand_from %s' -l %s -d %q\n", n, f.Name, firstClause(f.Usage))
		})
	}
}

// firstClause shortens a flag's usage to its first clause, for fish's
// one-line descriptions.
func firstClause(s string) string {
	if i := strings.IndexAny(s, ":;("); i > 0 {
		s = s[:i]
	}
	return strings.TrimSpace(strings.ReplaceAll(s, "`", ""))
}
