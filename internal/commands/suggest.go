package commands

import (
	"flag"
	"sort"
	"strings"
)

// didYouMean returns ", did you mean X?" for the candidate closest to a
// mistyped name (a letter dropped, added, changed or two swapped, twice at
// most), or "" when none is that close.
func didYouMean(name string, candidates []string, prefix string) string {
	best, bestD := "", 3
	if len(name) < 5 {
		bestD = 2
	}
	sort.Strings(candidates)
	for _, c := range candidates {
		if d := editDistance(name, c); d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	return "; did you mean " + prefix + best + "?"
}

// editDistance is the optimal string alignment distance: insertions,
// deletions, substitutions and transpositions of neighbours, each 1.
func editDistance(a, b string) int {
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

func commandNames() []string {
	var names []string
	for name, c := range registry {
		if !c.hidden {
			names = append(names, name)
		}
	}
	return names
}

// unknownFlag turns the flag package's "flag provided but not defined: -x"
// into the same with a suggestion among fs's flags.
func unknownFlag(fs *flag.FlagSet, msg string) string {
	const undefined = "flag provided but not defined: -"
	name, ok := strings.CutPrefix(msg, undefined)
	if !ok {
		return msg
	}
	name = strings.TrimPrefix(name, "-")
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return msg + didYouMean(name, names, "--")
}
