package audit

import (
	"slices"
	"testing"
)

func TestLoaderChecks(t *testing.T) {
	const serve = "vllm serve m --load-format "
	runSpellings(t, []spelling{
		{"strict is clean", "a.sh", serve + `ipc_cache --model-loader-extra-config '{"mode": "zero_copy", "fallback": false, "connect_timeout_s": 5.0, "state_timeout_s": 300.0}'` + "\n", nil},
		{"no config", "a.sh", serve + "ipc_cache\n", []string{"1:14 loader-fallback-default"}},
		{"fallback true is a decision", "a.sh", serve + `ipc_cache --model-loader-extra-config '{"fallback": true}'` + "\n", nil},
		{"fallback not set", "a.sh", serve + `ipc_cache --model-loader-extra-config '{"mode": "copy"}'` + "\n", []string{"1:38 loader-fallback-default"}},
		{"not json", "a.sh", serve + `ipc_cache --model-loader-extra-config "{'fallback': False}"` + "\n", []string{"1:38 loader-config-invalid"}},
		{"not an object", "a.sh", serve + `ipc_cache --model-loader-extra-config '[1]'` + "\n", []string{"1:38 loader-config-invalid"}},
		{"unknown key", "a.sh", serve + `ipc_cache --model-loader-extra-config '{"fallback": false, "timeout": 5}'` + "\n", []string{"1:38 loader-config-invalid"}},
		{"bad mode and types", "a.sh", serve + `ipc_cache --model-loader-extra-config '{"fallback": false, "mode": "zerocopy", "state_timeout_s": "5"}'` + "\n",
			[]string{"1:38 loader-config-invalid", "1:38 loader-config-invalid"}},
		{"pipeline parallel", "a.sh", serve + `ipc_cache --pipeline-parallel-size=2 --model-loader-extra-config '{"fallback": false}'` + "\n", nil},
		{"preload pipeline parallel", "a.sh", "vllm preload --model m -pp 2\nvllm serve m -pp 2\n", []string{"1:24 preload-pipeline-parallel"}},
		{"pipeline parallel 1", "a.sh", serve + `ipc_cache -pp 1 --model-loader-extra-config '{"fallback": false}'` + "\n", nil},
		{"sleep default mode", "a.sh", serve + `ipc_cache --enable-sleep-mode --model-loader-extra-config '{"fallback": false}'` + "\n", []string{"1:38 loader-zero-copy-sleep-mode"}},
		{"sleep copy mode", "a.sh", serve + `ipc_cache --enable-sleep-mode --model-loader-extra-config '{"mode": "copy", "fallback": false}'` + "\n", nil},
		{"sleep without loader", "a.sh", "vllm serve m --enable-sleep-mode -pp 2\n", nil},
		{"weightcache publish, which the plugin does not take", "a.sh", serve + `weightcache --model-loader-extra-config '{"fallback": false, "publish": true}'` + "\n", []string{"1:40 loader-config-invalid"}},
		{"weightcache bad publish", "a.sh", serve + `weightcache --model-loader-extra-config '{"fallback": false, "publish": 1}'` + "\n", []string{"1:40 loader-config-invalid"}},
		{"weightcache tier and socket_dir", "a.sh", serve + `weightcache --model-loader-extra-config '{"fallback": false, "tier": "auto", "socket_dir": "/run/wc"}'` + "\n", nil},
		{"weightcache bad tier", "a.sh", serve + `weightcache --model-loader-extra-config '{"fallback": false, "tier": "fast"}'` + "\n", []string{"1:40 loader-config-invalid"}},
		{"weightcache passes the default loader's keys on", "a.sh", serve + `weightcache --model-loader-extra-config '{"fallback": false, "num_threads": 4}'` + "\n", nil},
		{"ipc_cache socket_dir", "a.sh", serve + `ipc_cache --model-loader-extra-config '{"fallback": false, "socket_dir": "/run/v"}'` + "\n", nil},
		{"ipc_cache tier", "a.sh", serve + `ipc_cache --model-loader-extra-config '{"fallback": false, "tier": "auto"}'` + "\n", []string{"1:38 loader-config-invalid"}},
		{"ipc_cache publish", "a.sh", serve + `ipc_cache --model-loader-extra-config '{"fallback": false, "publish": true}'` + "\n", []string{"1:38 loader-config-invalid"}},
		{"config from variable", "a.sh", "CFG='{\"fallback\": false}'\n" + serve + `ipc_cache --model-loader-extra-config "$CFG"` + "\n", nil},
		{"config unresolved", "a.sh", serve + `ipc_cache --model-loader-extra-config "$CFG" --enable-sleep-mode` + "\n", nil},
		{"python dict config", "a.py", `AsyncEngineArgs(load_format="ipc_cache", model_loader_extra_config={"fallback": False,}, enable_sleep_mode=True)` + "\n",
			[]string{"1:90 loader-zero-copy-sleep-mode"}},
		{"python json.dumps", "a.py", `EngineArgs(load_format="weightcache", model_loader_extra_config=json.dumps({"mode": "copy"}))` + "\n",
			[]string{"1:39 loader-fallback-default"}},
		{"yaml config map", "c.yaml", "load_format: ipc_cache\nmodel_loader_extra_config:\n  fallback: false\n  mode: copy\nenable_sleep_mode: true\n", nil},
		{"other loader", "a.sh", "vllm serve m --load-format safetensors --model-loader-extra-config '{}'\n", nil},
	})
}

// TestChangedDefault: a changed default is noted where a whole command line
// starts the server without the flag, at the releases that have the change.
func TestChangedDefault(t *testing.T) {
	rs, err := LoadRules(nil, "", "0.32")
	if err != nil {
		t.Fatal(err)
	}
	const note = "changed-default/--allowed-origins@0.32"
	cases := []struct {
		name, file, src string
		want            []string
	}{
		{"serve", "a.sh", "vllm serve m --tokenizer-mode slow\n", []string{"1:1 " + note, "1:14 tokenizer-mode-slow"}},
		{"set", "a.sh", "vllm serve m --tokenizer-mode slow --allowed-origins '[]'\n", []string{"1:14 tokenizer-mode-slow"}},
		{"api server module", "a.sh", "python -m vllm.entrypoints.openai.api_server --tokenizer-mode slow\n", []string{"1:11 " + note, "1:11 deprecated-module/vllm.entrypoints.openai.api_server@0.29", "1:46 tokenizer-mode-slow"}},
		{"other programs", "a.sh", "vllm bench serve --tokenizer-mode slow\nvllm preload --model m --tokenizer-mode slow\n", []string{"1:18 tokenizer-mode-slow", "2:24 tokenizer-mode-slow"}},
		{"fragment", "a.sh", "VLLM_ARGS='--tokenizer-mode slow'\n", []string{"1:12 tokenizer-mode-slow"}},
		{"nothing else to report", "a.sh", "vllm serve m\n", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := brief(rs, scanSource(t, rs, c.file, c.src))
			if c.want == nil {
				c.want = []string{}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
	if rs31, _ := LoadRules(nil, "", "0.31"); slices.ContainsFunc(rs31.Rules, func(r *Rule) bool { return r.ID == note }) {
		t.Errorf("%s in force at 0.31", note)
	}
}

// TestCLIDeprecation: vllm serve --model warns (the parser prints it);
// the server module and images take --model as their way to name it.
func TestCLIDeprecation(t *testing.T) {
	const dep = "deprecated-flag/serve/--model@0.29"
	runSpellings(t, []spelling{
		{"vllm serve --model", "a.sh", "vllm serve --model m\n", []string{"1:12 " + dep}},
		{"positional", "a.sh", "vllm serve m\n", nil},
		{"preload", "a.sh", "vllm preload --model m\n", nil},
		{"server module", "a.sh", "python3 -m vllm.entrypoints.openai.api_server --model m\n", []string{"1:12 deprecated-module/vllm.entrypoints.openai.api_server@0.29"}},
		{"image", "a.sh", "docker run vllm/vllm-openai --model m\n", nil},
		{"expanded into vllm serve", "a.sh", "ARGS='--model m'\nvllm serve $ARGS\n", []string{"1:7 " + dep}},
	})
}

func TestCombinationAndDiffers(t *testing.T) {
	runSpellings(t, []spelling{
		{"v1 by mamba all with pp", "a.sh", "vllm serve m --mamba-cache-mode all -pp 2 --async-scheduling\n",
			[]string{"1:14 mamba-cache-mode-all-deprecated", "1:37 runner-v1-refused"}},
		{"v1 by mamba all, pp without async", "a.sh", "vllm serve m --mamba-cache-mode all -pp 2\n", []string{"1:14 mamba-cache-mode-all-deprecated"}},
		{"v1 by env with async at pp 1", "a.sh", "VLLM_USE_V2_MODEL_RUNNER=0 vllm serve m --async-scheduling\n", nil},
		{"v1 by env with async and pp", "a.sh", "VLLM_USE_V2_MODEL_RUNNER=0 vllm serve m -pp=2 --async-scheduling\n", []string{"1:41 runner-v1-refused"}},
		{"v1 with structured output", "k.yaml", "env:\n  - name: VLLM_USE_V2_MODEL_RUNNER\n    value: \"0\"\nargs: [--structured-outputs-config, '{}']\n", nil},
		{"v1 across a manifest", "k.yaml", "env:\n  - name: VLLM_USE_V2_MODEL_RUNNER\n    value: \"0\"\nargs: [--async-scheduling, -pp, '2']\n", []string{"4:8 runner-v1-refused"}},
		{"v1 by dbo in python", "a.py", "LLM(enable_dbo=True, pipeline_parallel_size=2, async_scheduling=True)\n", []string{"1:22 runner-v1-refused"}},
		{"v2 runner", "a.sh", "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve m --async-scheduling -pp 4\n", nil},
		{"v1 without conflict", "a.sh", "vllm serve m --enable-dbo -pp 1\n", nil},
		{"v1 in a comment only", "a.sh", "# --enable-dbo\nvllm serve m --async-scheduling\n", nil},
		{"ports equal", "a.sh", "weightcache preload --weight-cache-master-port 29500 &\nvllm serve m --master-port=29500\n", []string{"1:21 weight-cache-master-port"}},
		{"ports by variable", "a.sh", "P=29500\nweightcache preload --weight-cache-master-port $P --master-port \"$P\"\n", []string{"2:21 weight-cache-master-port"}},
		{"ports in python", "a.py", `subprocess.run(["weightcache", "preload", "--master-port", "29500", "--weight-cache-master-port", "29500"])` + "\n", []string{"1:69 weight-cache-master-port"}},
		{"ports in two services", "c.yaml", "services:\n  a:\n    command: weightcache preload --weight-cache-master-port 29500\n  b:\n    command: vllm serve m --master-port 29500\n", nil},
		{"ports in two containers", "k.yaml", "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n    - command: [weightcache, preload, --weight-cache-master-port, '29500']\n    - command: [vllm, serve, m, --master-port, '29500']\n", nil},
		{"ports in one unit", "w.service", "[Service]\nExecStartPre=weightcache preload --weight-cache-master-port 29500\nExecStart=vllm serve m --master-port 29500\n", []string{"2:34 weight-cache-master-port"}},
		{"v1 in two services", "c.yaml", "services:\n  a:\n    image: vllm/vllm-openai\n    environment: [VLLM_USE_V2_MODEL_RUNNER=0]\n  b:\n    image: vllm/vllm-openai\n    command: [--async-scheduling]\n", nil},
		{"v1 in one service", "c.yaml", "services:\n  a:\n    image: vllm/vllm-openai\n    environment: [VLLM_USE_V2_MODEL_RUNNER=0]\n    command: [-pp, '2', --async-scheduling]\n", []string{"5:15 runner-v1-refused"}},
		{"v1 on two command lines", "a.sh", "vllm serve a --enable-dbo\nvllm serve b --async-scheduling\n", nil},
		{"v1 by exported env", "a.sh", "export VLLM_USE_V2_MODEL_RUNNER=0\nvllm serve b --async-scheduling --pipeline-parallel-size 2\n", []string{"2:14 runner-v1-refused"}},
		{"ports differ", "a.sh", "weightcache preload --weight-cache-master-port 29600\nvllm serve m --master-port 29500\n", nil},
	})
}
