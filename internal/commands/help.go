package commands

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// groupOrder is the order flag groups are printed in. Help lists a command's
// flags under these headings, so that preload's thirty flags read by topic.
var groupOrder = []string{"model", "devices", "ranks", "GPU", "serving", "peers", "limits", "output", "other"}

// flagGroups places a flag by name; a flag's name means the same thing in
// every command. A flag missing here lands in its command's fallback group
// (or limits when it starts with "max-"), so flags added later still print.
var flagGroups = map[string]string{
	"model": "model", "revision": "model", "dtype": "model", "publish-only": "model",
	"draft-model": "model", "draft-dtype": "model", "draft-revision": "model",
	"preset": "model", "shards": "model", "out": "model",
	"engine": "model", "engine-version": "model",

	"devices": "devices", "device": "devices", "host-tier": "devices",

	"tensor-parallel-size": "ranks", "data-parallel-size": "ranks", "data-parallel-start-rank": "ranks",
	"data-parallel-size-local": "ranks", "tp-rank": "ranks", "dp-rank": "ranks", "group": "ranks",
	"nnodes": "ranks", "node-rank": "ranks", "master-addr": "ranks", "master-port": "ranks",
	"weight-cache-master-port": "ranks", "draft-weight-cache-master-port": "ranks",
	"weight-cache-rendezvous-timeout": "ranks", "sharding-plan": "ranks", "draft-sharding-plan": "ranks",

	"ipc": "GPU", "staging-bytes": "GPU", "reserve-bytes": "GPU", "pinned-chunk": "GPU",

	"socket-dir": "serving", "drain-timeout": "serving", "weight-cache-health-host": "serving",
	"weight-cache-health-port": "serving", "mode": "serving", "fallback": "serving",
	"connect-timeout": "serving", "state-timeout": "serving", "artifact-budget": "serving",

	"peers": "peers", "peer-listen": "peers", "peer-relay": "peers", "peer-tls-cert": "peers", "peer-tls-key": "peers", "peer-tls-ca": "peers",
	"peer-token-file": "peers", "peer-manifest-digest": "peers", "peer-trust-peers": "peers", "peer-rate-limit": "peers",
	"peer-max-conns": "peers", "peer-timeout": "peers", "peer-port": "peers",

	"load-workers": "limits", "read-limit": "limits", "memory-budget": "limits",

	"json": "output", "digest": "output", "touch": "output", "verify": "output", "hold": "output",
	"reread": "output", "format": "output", "fail-on": "output", "rules": "output", "target-version": "output",
}

func groupOf(c command, name string) string {
	if g, ok := flagGroups[name]; ok {
		return g
	}
	if strings.HasPrefix(name, "max-") {
		return "limits"
	}
	if c.fallbackGroup != "" {
		return c.fallbackGroup
	}
	return "other"
}

// printCommandHelp prints a command's synopsis, its flags by group in the
// --flag spelling, and its examples.
func printCommandHelp(w io.Writer, c command, fs *flag.FlagSet) {
	usage := c.usage
	if usage == "" {
		usage = c.name + " [flags]"
	}
	fmt.Fprintf(w, "usage: weightcache %s\n\n%s\n", usage, c.summary)
	byGroup := map[string][]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) {
		g := groupOf(c, f.Name)
		byGroup[g] = append(byGroup[g], f)
	})
	for _, g := range groupOrder {
		if len(byGroup[g]) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", g)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, f := range byGroup[g] {
			fmt.Fprintf(tw, "  %s\t%s\n", flagSynopsis(f), flagUsage(f))
		}
		_ = tw.Flush()
	}
	if len(c.examples) > 0 {
		fmt.Fprintln(w, "\nexamples:")
		for _, ex := range c.examples {
			fmt.Fprintf(w, "  %s\n", ex)
		}
	}
}

// flagSynopsis is "--name TYPE", or "--name" for a boolean.
func flagSynopsis(f *flag.Flag) string {
	kind, _ := flag.UnquoteUsage(f)
	if kind == "" {
		return "--" + f.Name
	}
	return "--" + f.Name + " " + kind
}

func flagUsage(f *flag.Flag) string {
	_, usage := flag.UnquoteUsage(f)
	switch f.DefValue {
	case "", "0", "false", "0s":
		return usage
	}
	if strings.Contains(usage, "(default") {
		return usage
	}
	return fmt.Sprintf("%s (default %s)", usage, f.DefValue)
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: weightcache <command> [flags]\n\ncommands:")
	names := visibleCommands()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, n := range names {
		fmt.Fprintf(tw, "  %s\t%s\n", n, registry[n].summary)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nweightcache help <command> (or <command> --help) lists its flags; weightcache --version prints the version.")
}

func visibleCommands() []string {
	names := make([]string, 0, len(registry))
	for n, c := range registry {
		if !c.hidden {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}
