package audit

import (
	"maps"
	"slices"
)

// factLoaders are the loaders whose --model-loader-extra-config the audit
// checks, at the newest release at or before target: vLLM's ipc_cache
// (its constructor raises on any key it did not pop), and the weightcache
// plugin, which takes its own keys and hands the rest to vLLM's
// DefaultModelLoader, which refuses what it does not know.
func factLoaders(target version) []*Loader {
	var rel *release
	for _, r := range releases {
		if !r.v.after(target) {
			rel = r
		}
	}
	if rel == nil {
		return nil
	}
	var out []*Loader
	if ipc, ok := rel.Loaders["ipc_cache"]; ok {
		l := fromFacts("ipc_cache", ipc.Keys)
		l.Source = rel.cite(ipc.File, ipc.Line)
		out = append(out, l)
	}
	keys := maps.Clone(pluginKeys.Keys)
	def := rel.Loaders["auto"]
	maps.Copy(keys, def.Keys)
	l := fromFacts(pluginKeys.LoadFormat, keys)
	l.Source = pluginKeys.Source + ", then " + rel.cite(def.File, def.Line)
	return append(out, l)
}

func fromFacts(format string, keys map[string]loaderKey) *Loader {
	l := &Loader{LoadFormat: format, Keys: map[string]string{}, Choices: map[string][]string{}}
	for name, k := range keys {
		t := k.Type
		switch {
		case name == "mode" && t == "choice":
			t, l.Modes = "mode", slices.Clone(k.Choices)
			l.DefaultMode, _ = k.Default.(string)
		case t == "choice":
			l.Choices[name] = slices.Clone(k.Choices)
		}
		l.Keys[name] = t
	}
	return l
}
