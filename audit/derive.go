package audit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Rules derived from the facts: what one release accepts and the next
// does not (removed, renamed), what a release says it will remove
// (deprecated) and what it now does by default. Each rule cites the
// facts that decide it; none is written by hand.

// Rule kinds, as counted in the report and held to the facts by tests.
const (
	kindRemoved    = "removed"
	kindRenamed    = "renamed"
	kindDeprecated = "deprecated"
	kindDefault    = "default"
	kindSemantic   = "semantic" // hand-written, with a citation
)

// deriveRules returns the rules every consecutive pair of releases implies,
// and the deprecations the first release already announces.
func deriveRules(rels []*release) []*Rule {
	var out []*Rule
	if len(rels) > 0 {
		out = append(out, deprecations(nil, rels[0])...)
	}
	for i := 1; i < len(rels); i++ {
		a, b := rels[i-1], rels[i]
		out = append(out, flagChanges(a, b)...)
		out = append(out, deprecations(a, b)...)
		out = append(out, envChanges(a, b)...)
		out = append(out, moduleChanges(a, b)...)
	}
	keepDeprecations(out, rels)
	return mergeSubcommands(out)
}

// keepDeprecations keeps a deprecation in force past the release it
// announced the removal for when that release still accepts the flag
// (0.33 kept --log-config-file): the facts, not the announcement, decide.
func keepDeprecations(rules []*Rule, rels []*release) {
	for _, r := range rules {
		if r.Kind != kindDeprecated || r.Until == "" || r.Flag == "" {
			continue
		}
		for _, rel := range rels {
			if minor(rel.v) != r.Until {
				continue
			}
			if o, _ := rel.option(normalizeFlag(r.Flag)); o != nil {
				r.Message += "; " + rel.Version + " still accepts it"
				r.Until = ""
			}
		}
	}
}

// flagChanges: spellings, choices and defaults of each subcommand's
// options that b changed.
func flagChanges(a, b *release) []*Rule {
	var out []*Rule
	for _, sub := range []string{"serve", "preload"} {
		olds, news := a.Commands[sub], b.Commands[sub]
		if len(olds) == 0 || len(news) == 0 {
			continue
		}
		byDest := map[string]*option{}
		spelled := map[string]bool{}
		for i := range news {
			byDest[news[i].Dest] = &news[i]
			for _, f := range news[i].Flags {
				spelled[f] = true
			}
		}
		for i := range olds {
			o := &olds[i]
			n := byDest[o.Dest]
			for _, f := range o.Flags {
				if spelled[f] {
					continue
				}
				out = append(out, spellingGone(a, b, sub, o, n, f))
			}
			if n == nil || !slices.Contains(n.Flags, o.Flags[0]) {
				continue
			}
			for _, c := range o.Choices {
				if len(n.Choices) > 0 && !slices.Contains(n.Choices, c) {
					out = append(out, choiceGone(a, b, sub, o, n, c))
				}
			}
			if r := defaultChanged(a, b, sub, o, n); r != nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// spellingGone: flag f of option o is not accepted by b. Where b has the
// same setting (its dest) under a spelling a did not have, that is the new
// name.
func spellingGone(a, b *release, sub string, o, n *option, f string) *Rule {
	r := &Rule{Release: minor(b.v), Severity: "error", Kind: kindRemoved,
		Match:  Match{Flag: f},
		Source: fmt.Sprintf("%s declares %s; %s accepts no %s", a.cite(o.File, o.Line), f, b.Version, f),
		Sub:    []string{sub}}
	var added []string
	if n != nil {
		for _, g := range n.Flags {
			if !slices.Contains(o.Flags, g) {
				added = append(added, g)
			}
		}
	}
	if len(added) == 1 {
		r.ID, r.Kind = "renamed-flag/"+f+"@"+minor(b.v), kindRenamed
		r.Message = fmt.Sprintf("%s is now spelled %s; vLLM refuses the old spelling (unrecognized arguments)", f, added[0])
		r.Fix = "spell it " + added[0]
		r.Source += fmt.Sprintf(", and declares the same setting (%s) as %s at %s:%d", n.Dest, added[0], n.File, n.Line)
		return r
	}
	r.ID = "removed-flag/" + f + "@" + minor(b.v)
	r.Message = f + " was removed; vLLM refuses it at start (unrecognized arguments)"
	r.Fix = "remove the flag"
	if n != nil {
		r.Fix = "spell the setting " + strings.Join(n.Flags, " or ")
	}
	return r
}

func choiceGone(a, b *release, sub string, o, n *option, c string) *Rule {
	flag := o.Flags[0]
	fix := "choose one of " + strings.Join(n.Choices, ", ")
	if n.Nargs == "+" || n.Nargs == "*" {
		// The option takes a list: its items are separate words.
		fix = "give one or more of " + strings.Join(n.Choices, ", ") + ", each a word of its own"
	}
	return &Rule{ID: fmt.Sprintf("removed-choice/%s=%s@%s", flag, c, minor(b.v)), Release: minor(b.v), Severity: "error", Kind: kindRemoved,
		Match:   Match{Flag: flag, Aliases: o.Flags[1:], Values: []string{c}},
		Message: fmt.Sprintf("%s %s is no longer a choice; vLLM refuses it at start (invalid choice)", flag, c),
		Fix:     fix,
		Source:  fmt.Sprintf("%s lists %s among the choices of %s; %s does not (%s:%d)", a.cite(o.File, o.Line), c, flag, b.Version, n.File, n.Line),
		Sub:     []string{sub}}
}

// defaultChanged: a plain default (a boolean, number, string or list of
// them) that b changed. It matters where the flag is not given, so the
// rule looks for its absence on a vLLM command line.
func defaultChanged(a, b *release, sub string, o, n *option) *Rule {
	if !plainDefault(o.Default) || !plainDefault(n.Default) || o.Default == nil || n.Default == nil || sameJSON(o.Default, n.Default) {
		return nil
	}
	flag := o.Flags[0]
	was, now := showJSON(o.Default), showJSON(n.Default)
	// A note: a different default is neither a refusal nor a deprecation,
	// and every command line that leaves the flag out has it.
	return &Rule{ID: "changed-default/" + flag + "@" + minor(b.v), Release: minor(b.v), Severity: "note", Kind: kindDefault,
		Check: "unset", Match: Match{Flag: flag, Aliases: o.Flags[1:]},
		Message: fmt.Sprintf("the default of %s changed from %s to %s, and this command line does not set it", flag, was, now),
		Fix:     fmt.Sprintf("set %s explicitly if the command relies on %s", flag, was),
		Source:  fmt.Sprintf("%s: default %s; %s:%d in %s: default %s", a.cite(o.File, o.Line), was, n.File, n.Line, b.Version, now),
		Sub:     []string{sub}}
}

func plainDefault(v any) bool {
	switch x := v.(type) {
	case nil, bool, float64:
		return true
	case string:
		// Config objects are written as their repr; UNSET and SUPPRESS
		// are sentinels, not values.
		return !strings.ContainsAny(x, "(){}<>") && x != "==SUPPRESS==" && x != "UNSET"
	case []any:
		for _, e := range x {
			if _, ok := e.(string); !ok {
				return false
			}
		}
		return true
	}
	return false
}

func sameJSON(x, y any) bool { return showJSON(x) == showJSON(y) }

func showJSON(v any) string {
	b, _ := json.Marshal(v) // facts are decoded JSON: always encodable
	return string(b)
}

// deprecations: options b deprecates that a did not (all of them where
// a is nil), and modules b deprecates.
func deprecations(a, b *release) []*Rule {
	var out []*Rule
	for _, sub := range []string{"serve", "preload"} {
		for _, n := range b.Commands[sub] {
			if n.Deprecated == "" {
				continue
			}
			if a != nil {
				if o, _ := a.option(normalizeFlag(n.Flags[0])); o != nil && o.Deprecated != "" {
					continue
				}
			}
			out = append(out, deprecated(b, sub, n))
		}
	}
	for _, d := range b.CLIDeprecations {
		if a != nil && slices.ContainsFunc(a.CLIDeprecations, func(p cliDeprecation) bool { return p.Flag == d.Flag && p.Command == d.Command }) {
			continue
		}
		r := &Rule{ID: "deprecated-flag/" + d.Command + "/" + d.Flag + "@" + minor(b.v), Release: minor(b.v), Severity: "warning", Kind: kindDeprecated,
			Match: Match{Flag: d.Flag}, CLI: true,
			Message: fmt.Sprintf("vllm %s %s is deprecated: %s", d.Command, d.Flag, d.Message),
			Fix:     "give the setting as vLLM's message says",
			Source:  b.cite(d.File, d.Line)}
		if d.Command != "" {
			r.Sub = []string{d.Command}
		}
		out = append(out, r)
	}
	for _, m := range b.Modules {
		if m.Deprecated == "" || (a != nil && a.module(m.Name) != nil && a.module(m.Name).Deprecated != "") {
			continue
		}
		fix := "run what the deprecation names instead of python -m " + m.Name
		if m.Name == apiServerModule { // its message names `vllm server`, which does not exist
			fix = "start the server with `vllm serve MODEL [flags]`"
		}
		r := &Rule{ID: "deprecated-module/" + m.Name + "@" + minor(b.v), Release: minor(b.v), Severity: "warning", Kind: kindDeprecated,
			Match:   Match{Module: m.Name},
			Message: m.Name + " is deprecated: " + m.Deprecated,
			Fix:     fix,
			Source:  b.cite(m.File, m.Line)}
		announce(r, m.RemovedIn, b)
		out = append(out, r)
	}
	return out
}

func deprecated(b *release, sub string, n option) *Rule {
	flag := n.Flags[0]
	r := &Rule{ID: "deprecated-flag/" + flag + "@" + minor(b.v), Release: minor(b.v), Severity: "warning", Kind: kindDeprecated,
		Match:   Match{Flag: flag, Aliases: n.Flags[1:]},
		Message: flag + " is deprecated: " + n.Deprecated,
		Fix:     "drop " + flag + " or move to what the deprecation names",
		Source:  b.cite(n.File, n.Line),
		Sub:     []string{sub}}
	announce(r, n.RemovedIn, b)
	return r
}

// announce bounds a deprecation by the release it names for the removal:
// from that release on the removal rule speaks. A removal announced for
// the release that still accepts the setting (0.33 for --mamba-cache-mode)
// bounds nothing.
func announce(r *Rule, removedIn string, b *release) {
	if removedIn == "" {
		return
	}
	r.Message += " (announced for removal in " + removedIn + ")"
	if v, err := parseVersion(removedIn); err == nil && v.after(b.v) {
		r.Until = removedIn
	}
}

// envChanges: variables a reads and b does not. One is renamed when b
// reads a new variable with the same definition whose name shares a word
// with it; it moved to a flag when b has the flag of the same name.
func envChanges(a, b *release) []*Rule {
	var out []*Rule
	var added []*envVar
	for i := range b.Env {
		if !a.reads(b.Env[i].Name) {
			added = append(added, &b.Env[i])
		}
	}
	for i := range a.Env {
		e := &a.Env[i]
		if b.reads(e.Name) {
			continue
		}
		r := &Rule{Release: minor(b.v), Severity: "warning", Kind: kindRemoved, Match: Match{Env: e.Name},
			Source: fmt.Sprintf("%s reads %s; %s does not", a.cite(e.File, e.Line), e.Name, b.Version)}
		flag := "--" + dashify(strings.ToLower(strings.TrimPrefix(e.Name, "VLLM_")))
		if n := renamedTo(e, added); n != nil {
			r.ID, r.Kind = "renamed-env/"+e.Name+"@"+minor(b.v), kindRenamed
			r.Message = fmt.Sprintf("%s was renamed %s; the old name has no effect", e.Name, n.Name)
			r.Fix = "set " + n.Name + " instead"
			r.Source += fmt.Sprintf(", and reads %s with the same definition (%s:%d)", n.Name, n.File, n.Line)
		} else if o, _ := b.option(flag); o != nil {
			r.ID, r.Kind = "renamed-env/"+e.Name+"@"+minor(b.v), kindRenamed
			r.Message = fmt.Sprintf("%s is no longer read; the setting is the flag %s", e.Name, flag)
			r.Fix = "pass " + flag + " on the vLLM command line instead"
			r.Source += fmt.Sprintf("; it has the flag %s (%s:%d)", flag, o.File, o.Line)
		} else {
			r.ID = "removed-env/" + e.Name + "@" + minor(b.v)
			r.Message = e.Name + " was removed; setting it has no effect"
			r.Fix = "delete it"
		}
		out = append(out, r)
	}
	return out
}

// genericWords say nothing about what a variable is for.
var genericWords = map[string]bool{"VLLM": true, "USE": true, "ENABLE": true, "DISABLE": true}

func renamedTo(e *envVar, added []*envVar) *envVar {
	var best *envVar
	score, tie := 0, false
	for _, n := range added {
		if n.Definition != e.Definition {
			continue
		}
		s := sharedWords(e.Name, n.Name)
		switch {
		case s > score:
			best, score, tie = n, s, false
		case s == score && s > 0:
			tie = true
		}
	}
	if tie {
		return nil
	}
	return best
}

func sharedWords(x, y string) int {
	n := 0
	ys := strings.Split(y, "_")
	for _, w := range strings.Split(x, "_") {
		if !genericWords[w] && slices.Contains(ys, w) {
			n++
		}
	}
	return n
}

func moduleChanges(a, b *release) []*Rule {
	var out []*Rule
	for _, m := range a.Modules {
		if b.module(m.Name) != nil {
			continue
		}
		out = append(out, &Rule{ID: "removed-module/" + m.Name + "@" + minor(b.v), Release: minor(b.v), Severity: "error", Kind: kindRemoved,
			Match:   Match{Module: m.Name},
			Message: "python -m " + m.Name + " was removed",
			Fix:     "start the server with `vllm serve MODEL [flags]`",
			Source:  fmt.Sprintf("%s; %s has no %s", a.cite(m.File, m.Line), b.Version, m.File)})
	}
	return out
}

// mergeSubcommands makes one rule of a change both subcommands share.
func mergeSubcommands(rules []*Rule) []*Rule {
	var out []*Rule
	byID := map[string]*Rule{}
	for _, r := range rules {
		if prev := byID[r.ID]; prev != nil {
			for _, s := range r.Sub {
				if !slices.Contains(prev.Sub, s) {
					prev.Sub = append(prev.Sub, s)
				}
			}
			continue
		}
		byID[r.ID] = r
		out = append(out, r)
	}
	for _, r := range out {
		if len(r.Sub) == 2 {
			r.Sub = nil // every subcommand
		}
	}
	return out
}
