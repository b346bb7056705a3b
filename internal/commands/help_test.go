package commands

import (
	"bytes"
	"context"
	"flag"
	"os/exec"
	"strings"
	"testing"

	"github.com/weightcache/weightcache/internal/version"
)

func runIn(args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	code = run(context.Background(), env{stdout: &o, stderr: &e}, args)
	return o.String(), e.String(), code
}

// Every visible command's help lists every flag it parses, as --flag under a
// known heading, and at least one example that runs that command.
func TestHelpListsEveryFlagByGroup(t *testing.T) {
	for _, name := range visibleCommands() {
		t.Run(name, func(t *testing.T) {
			out, _, code := runIn(name, "--help")
			if code != exitOK {
				t.Fatalf("%s --help: exit %d", name, code)
			}
			if viaHelp, _, _ := runIn("help", name); viaHelp != out {
				t.Fatalf("help %s differs from %s --help", name, name)
			}
			if !strings.HasPrefix(out, "usage: weightcache "+name) {
				t.Fatalf("no usage line:\n%s", out)
			}
			commandFlags(registry[name]).VisitAll(func(f *flag.Flag) {
				if !strings.Contains(out, "\n  --"+f.Name+" ") && !strings.Contains(out, "\n  --"+f.Name+"\n") {
					t.Errorf("help does not list --%s:\n%s", f.Name, out)
				}
			})
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "-") && !strings.HasPrefix(strings.TrimSpace(line), "--") {
					t.Errorf("single-dash flag in help: %q", line)
				}
				if h, ok := strings.CutSuffix(line, ":"); ok && !strings.HasPrefix(line, " ") && h != "examples" && !strings.Contains(h, " ") {
					if !contains(groupOrder, h) {
						t.Errorf("unknown heading %q", h)
					}
				}
			}
			_, ex, ok := strings.Cut(out, "\nexamples:\n")
			if !ok || !strings.HasPrefix(ex, "  weightcache "+name) && !strings.HasPrefix(ex, "  source <(weightcache "+name) {
				t.Fatalf("no example of weightcache %s:\n%s", name, out)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A flag another change adds without naming its group still prints: under
// limits for max-*, else under its command's fallback heading.
func TestGroupOfUnknownFlag(t *testing.T) {
	c := command{name: "x", fallbackGroup: "serving"}
	for _, tt := range []struct{ flag, want string }{
		{"model", "model"}, {"max-publish-bytes", "limits"}, {"brand-new", "serving"},
	} {
		if got := groupOf(c, tt.flag); got != tt.want {
			t.Errorf("groupOf(%q) = %q, want %q", tt.flag, got, tt.want)
		}
	}
	if got := groupOf(command{}, "brand-new"); got != "other" {
		t.Errorf("no fallback group: %q, want other", got)
	}
	var out bytes.Buffer
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Int("brand-new", 7, "a flag help has never heard of")
	printCommandHelp(&out, c, fs)
	if !strings.Contains(out.String(), "serving:\n  --brand-new int  a flag help has never heard of (default 7)") {
		t.Fatalf("unexpected help:\n%s", out.String())
	}
}

func TestBadFlagIsUsageErrorWithDoubleDash(t *testing.T) {
	out, errOut, code := runIn("status", "--bogus")
	if code != exitUsage || out != "" || !strings.Contains(errOut, "not defined: --bogus") || strings.Contains(errOut, "examples:") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestVersion(t *testing.T) {
	defer func(v string) { version.Linked = v }(version.Linked)
	version.Linked = "9.8.7"
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, _, code := runIn(args...)
		if code != exitOK || !strings.HasPrefix(out, "weightcache 9.8.7 (go") {
			t.Fatalf("%v: exit %d, %q", args, code, out)
		}
	}
	// Not linked (go build, go test): the release number from VERSION.
	version.Linked = ""
	if out, _, _ := runIn("--version"); !strings.HasPrefix(out, "weightcache "+version.Release()) {
		t.Fatalf("unlinked version: %q, want release %s", out, version.Release())
	}
}

// The bash script is valid bash and completes commands, flags and values.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash is not installed")
	}
	script, _, code := runIn("completion", "bash")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, tt := range []struct{ words, want string }{
		{"weightcache pre", "preload"},
		{"weightcache preload --tensor-par", "--tensor-parallel-size"},
		{"weightcache attach --fall", "--fallback"},
		{"weightcache completion ba", "bash"},
		{"weightcache help sta", "status"},
	} {
		probe := script + "\nCOMP_WORDS=(" + tt.words + "); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _weightcache; echo \"${COMPREPLY[*]}\"\n"
		out, err := exec.Command(bash, "--norc", "-c", probe).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != tt.want {
			t.Errorf("%q: got %q (%v), want %q", tt.words, out, err, tt.want)
		}
	}
	if _, _, code := runIn("completion", "tcsh"); code != exitUsage {
		t.Errorf("completion tcsh: exit %d, want %d", code, exitUsage)
	}
}

func TestCompletionFishAndZsh(t *testing.T) {
	fish, _, _ := runIn("completion", "fish")
	if !strings.Contains(fish, "__fish_seen_subcommand_from preload' -l tensor-parallel-size") {
		t.Fatalf("fish script lacks preload's flags:\n%s", fish)
	}
	zsh, _, _ := runIn("completion", "zsh")
	if !strings.HasPrefix(zsh, "#compdef weightcache\n") || !strings.Contains(zsh, "complete -o default -F _weightcache weightcache") {
		t.Fatalf("zsh script:\n%s", zsh)
	}
}
