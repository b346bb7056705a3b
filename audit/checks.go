package audit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
)

// Flags the loader checks read; they are vLLM's interface, not rule data.
const (
	loadFormatFlag   = "--load-format"
	loaderConfigFlag = "--model-loader-extra-config"
)

// checks runs the rules that look at settings together: within one vLLM
// command line (with the environment it runs in) for the runner and the
// loader, within one scope (a script, unit, container, service, stage)
// for the ports of two processes. Comments never count here.
func (s *fileScan) checks() {
	for _, r := range s.rs.Rules {
		if !s.active[r.idx] {
			continue
		}
		switch r.Check {
		case "combination":
			for i := range s.facts.Commands {
				s.combination(r, i)
			}
		case "differs":
			s.differs(r)
		case "unset":
			for i := range s.facts.Commands {
				s.unset(r, i)
			}
		case "unknown-env":
			s.unknownEnv(r)
		}
	}
	for i, c := range s.facts.Commands {
		if !c.Comment && c.prog == progVLLM {
			s.loader(s.flags[i])
		}
	}
}

// combination reports command i when it has every conflict and it, or the
// environment it runs in, has a trigger.
func (s *fileScan) combination(r *Rule, i int) {
	c := &s.facts.Commands[i]
	if c.Comment || c.prog != progVLLM {
		return
	}
	trigger := s.firstTrigger(r.Triggers, i)
	if trigger == "" {
		return
	}
	flags := s.flags[i]
	var found []*flagUse
	for k := range r.Conflicts {
		j := slices.IndexFunc(flags, func(fu flagUse) bool { return r.Conflicts[k].matchesFlag(&fu) })
		if j < 0 {
			return
		}
		found = append(found, &flags[j])
	}
	slices.SortFunc(found, func(a, b *flagUse) int {
		return cmp.Or(cmp.Compare(a.pos.Line, b.pos.Line), cmp.Compare(a.pos.Col, b.pos.Col))
	})
	spelled := make([]string, len(found))
	for k, fu := range found {
		spelled[k] = spell(fu)
	}
	s.add(r, found[0].pos, false, fmt.Sprintf("%s here, and Model Runner V1 is selected by %s", strings.Join(spelled, " with "), trigger))
}

func (s *fileScan) firstTrigger(ms []Match, i int) string {
	flags := s.flags[i]
	for j := range flags {
		for k := range ms {
			if fu := &flags[j]; ms[k].matchesFlag(fu) {
				return fmt.Sprintf("%s at line %d", spell(fu), fu.pos.Line)
			}
		}
	}
	scope := s.facts.Commands[i].Scope
	for k := range s.facts.Env {
		e := &s.facts.Env[k]
		if !e.Set || e.Comment || e.Scope != scope || (e.Cmd >= 0 && e.Cmd != i) {
			continue
		}
		for m := range ms {
			if ms[m].Env != "" && ms[m].matchesEnv(e) {
				return fmt.Sprintf("%s=%s at line %d", e.Name, e.Value, e.Pos.Line)
			}
		}
	}
	return ""
}

// unset reports a whole command line that starts vLLM's server and does
// not set the rule's flag: the default it runs with changed. Fragments of
// flags and keyword arguments are not whole; other vLLM programs (run_batch,
// bench) have their own options.
func (s *fileScan) unset(r *Rule, i int) {
	c := &s.facts.Commands[i]
	if c.Comment || c.prog != progVLLM || !servesWhole(c) || !r.appliesTo(c) {
		return
	}
	for j := range s.flags[i] {
		if slices.Contains(r.flagNames(), s.flags[i][j].name) {
			return
		}
	}
	s.add(r, c.Words[c.args-1].Pos, false, "")
}

// servesWhole: vllm serve, python -m vllm.entrypoints.openai.api_server,
// or a vLLM image's own entrypoint, written out whole.
func servesWhole(c *Command) bool {
	switch {
	case c.args == 0 || c.args > len(c.Words):
		return false
	case c.module >= 0:
		return c.Words[c.module].Text == apiServerModule
	case path.Base(c.Words[c.args-1].Text) == "vllm": // the CLI
		return c.args < len(c.Words) && c.Words[c.args].Text == "serve"
	}
	return isVLLMImage(c.Words[c.args-1].Text)
}

// apiServerModule is the module vLLM's image runs.
const apiServerModule = "vllm.entrypoints.openai.api_server"

// spell writes a flag use back as an operator would read it.
func spell(fu *flagUse) string {
	if fu.hasVal && fu.inline {
		return fu.name + "=" + fu.value
	}
	if fu.hasVal && !strings.HasPrefix(fu.value, "-") && fu.name != "" {
		return fu.name + " " + fu.value
	}
	return fu.name
}

// differs reports a flag whose value equals another flag's in the same
// scope: two processes of one node must not rendezvous on one port.
func (s *fileScan) differs(r *Rule) {
	other, own := normalizeFlag(r.DiffersFrom), normalizeFlag(r.Flag)
	type key struct {
		scope int
		value string
	}
	seen := map[key]Pos{}
	for i, flags := range s.flags {
		c := &s.facts.Commands[i]
		for _, fu := range flags {
			if fu.name == other && fu.hasVal && !fu.comment {
				if _, dup := seen[key{c.Scope, fu.value}]; !dup {
					seen[key{c.Scope, fu.value}] = fu.pos
				}
			}
		}
	}
	for i, flags := range s.flags {
		c := &s.facts.Commands[i]
		for j := range flags {
			fu := &flags[j]
			if p, eq := seen[key{c.Scope, fu.value}]; fu.name == own && fu.hasVal && !fu.comment && eq {
				s.add(r, fu.pos, false, fmt.Sprintf("both are %s (%s at line %d)", fu.value, other, p.Line))
			}
		}
	}
}

// loader checks one argument list that selects a weight-cache loader.
func (s *fileScan) loader(flags []flagUse) {
	var lf, cfg *flagUse
	var l *Loader
	for j := range flags {
		fu := &flags[j]
		switch {
		case fu.name == loadFormatFlag && fu.hasVal && s.rs.Loaders[fu.value] != nil:
			lf, l = fu, s.rs.Loaders[fu.value]
		case fu.name == loaderConfigFlag && fu.hasVal:
			cfg = fu
		}
	}
	if lf == nil {
		return
	}
	mode, modeKnown := l.DefaultMode, true
	var conf map[string]json.RawMessage
	switch {
	case cfg == nil:
		s.byCheck("loader-fallback", lf.pos, fmt.Sprintf("%s without %s", spell(lf), loaderConfigFlag))
	case cfg.opaque:
		modeKnown = false // an expression: nothing to read
	default:
		var problems []string
		conf, problems = l.validate(cfg.value)
		for _, p := range problems {
			s.byCheck("loader-config", cfg.pos, p)
		}
		if conf == nil {
			modeKnown = false
			break
		}
		// Only the default is reported: "fallback": true written out is a
		// decision (serve from disk on a miss), as the project's own example
		// Deployments make it, and warning on it would teach users to ignore
		// the warning.
		if _, set := conf["fallback"]; !set {
			s.byCheck("loader-fallback", cfg.pos, fmt.Sprintf("%s does not set \"fallback\"", loaderConfigFlag))
		}
		if raw, ok := conf["mode"]; ok {
			modeKnown = json.Unmarshal(raw, &mode) == nil
		}
	}
	for _, r := range s.rs.Rules {
		if r.Check != "loader-conflict" || !s.active[r.idx] || (len(r.Modes) > 0 && (!modeKnown || !slices.Contains(r.Modes, mode))) ||
			(len(r.LoadFormats) > 0 && !slices.Contains(r.LoadFormats, lf.value)) {
			continue
		}
		for j := range flags {
			for k := range r.Conflicts {
				if fu := &flags[j]; r.Conflicts[k].matchesFlag(fu) {
					s.add(r, fu.pos, false, fmt.Sprintf("%s with %s (line %d), mode %s", spell(fu), spell(lf), lf.pos.Line, mode))
				}
			}
		}
	}
}

func (s *fileScan) byCheck(check string, p Pos, detail string) {
	for _, r := range s.rs.Rules {
		if r.Check == check && s.active[r.idx] {
			s.add(r, p, false, detail)
		}
	}
}

// validate reads a loader configuration; conf is nil when it is not a JSON
// object at all.
func (l *Loader) validate(text string) (conf map[string]json.RawMessage, problems []string) {
	if err := json.Unmarshal([]byte(text), &conf); err != nil {
		return nil, []string{fmt.Sprintf("%q is not a JSON object: %v", text, err)}
	}
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if p := l.checkKey(k, conf[k]); p != "" {
			problems = append(problems, p)
		}
	}
	return conf, problems
}

func (l *Loader) checkKey(k string, raw json.RawMessage) string {
	switch l.Keys[k] {
	case "":
		known := make([]string, 0, len(l.Keys))
		for name := range l.Keys {
			known = append(known, name)
		}
		sort.Strings(known)
		msg := fmt.Sprintf("unknown key %q for --load-format %s (known: %s", k, l.LoadFormat, strings.Join(known, ", "))
		if l.Source != "" {
			msg += "; from " + l.Source
		}
		return msg + ")"
	case "mode":
		var m string
		if json.Unmarshal(raw, &m) != nil || !slices.Contains(l.Modes, m) {
			return fmt.Sprintf("mode is %s, not one of %s", raw, strings.Join(l.Modes, ", "))
		}
	case "bool":
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return fmt.Sprintf("%s is %s, not true or false", k, raw)
		}
	case "seconds":
		var f float64
		if json.Unmarshal(raw, &f) != nil || f <= 0 {
			return fmt.Sprintf("%s is %s, not a positive number of seconds", k, raw)
		}
	case "number":
		var f float64
		if json.Unmarshal(raw, &f) != nil {
			return fmt.Sprintf("%s is %s, not a number", k, raw)
		}
	case "string":
		var v string
		if json.Unmarshal(raw, &v) != nil {
			return fmt.Sprintf("%s is %s, not a string", k, raw)
		}
	case "choice":
		var v string
		if json.Unmarshal(raw, &v) != nil || !slices.Contains(l.Choices[k], v) {
			return fmt.Sprintf("%s is %s, not one of %s", k, raw, strings.Join(l.Choices[k], ", "))
		}
	}
	return ""
}
