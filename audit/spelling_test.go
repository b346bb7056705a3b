package audit

import (
	"fmt"
	"slices"
	"testing"
)

// scanSource audits one in-memory file as the walker would: kind from its
// name, prefilter, parse, rules.
func scanSource(t *testing.T, rs *RuleSet, name, src string) []Finding {
	t.Helper()
	k := kindOf(name)
	if k == kindSniff {
		k, _ = sniff([]byte(src))
	}
	active, any := rs.pre.active([]byte(src))
	if !any {
		return nil
	}
	a := &auditor{rs: rs}
	return sortFindings(a.scan(name, k, []byte(src), active))
}

// brief is "line:col rule" for each finding, with the severity when it is
// not the rule's own (comments, mentions).
func brief(rs *RuleSet, fs []Finding) []string {
	out := []string{}
	for _, f := range fs {
		s := fmt.Sprintf("%d:%d %s", f.Line, f.Column, f.Rule)
		if i := slices.IndexFunc(rs.Rules, func(r *Rule) bool { return r.ID == f.Rule }); f.InComment || (i >= 0 && rs.Rules[i].sev != f.Severity) {
			s += " " + f.Severity.String()
		}
		out = append(out, s)
	}
	return out
}

type spelling struct {
	name, file, src string
	want            []string
}

func runSpellings(t *testing.T, cases []spelling) {
	t.Helper()
	rs := builtin(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := brief(rs, scanSource(t, rs, c.file, c.src))
			want := c.want
			if want == nil {
				want = []string{}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s:\n%s\ngot  %q\nwant %q", c.file, c.src, got, want)
			}
		})
	}
}

func TestFlagSpellings(t *testing.T) {
	runSpellings(t, []spelling{
		{"space", "a.sh", "vllm serve m --quantization fp8\n", []string{"1:14 quantization-fp8-redirect"}},
		{"equals", "a.sh", "vllm serve m --quantization=fp8\n", []string{"1:14 quantization-fp8-redirect"}},
		{"quoted value", "a.sh", `vllm serve m --quantization "fp8"` + "\n", []string{"1:14 quantization-fp8-redirect"}},
		{"short alias", "a.sh", "vllm serve m -q 'fp8'\n", []string{"1:14 quantization-fp8-redirect"}},
		{"underscore flag", "a.sh", "vllm serve m --tokenizer_mode=slow\n", []string{"1:14 tokenizer-mode-slow"}},
		{"continuations", "a.sh", "vllm serve m \\\n  --quantization \\\n  fp8\n", []string{"2:3 quantization-fp8-redirect"}},
		{"after then", "a.sh", "if [ -n \"$Q\" ]; then vllm serve m --quantization fp8; else exec vllm serve m; fi\n", []string{"1:35 quantization-fp8-redirect"}},
		{"uv run", "a.sh", "uv run --with vllm vllm serve m --quantization fp8\n", []string{"1:33 quantization-fp8-redirect"}},
		{"conda run", "a.sh", "conda run -n serve vllm serve m --quantization fp8\n", []string{"1:33 quantization-fp8-redirect"}},
		{"wrappers", "a.sh", "exec sudo -E -u vllm nohup timeout 3600 /opt/venv/bin/vllm serve m --quantization fp8\n", []string{"1:68 quantization-fp8-redirect"}},
		{"sh -c string", "a.sh", `sh -c "exec vllm serve m --tokenizer-mode slow"` + "\n", []string{"1:26 tokenizer-mode-slow"}},
		{"variable value", "a.sh", "Q=fp8\nvllm serve m --quantization \"$Q\"\n", []string{"2:14 quantization-fp8-redirect"}},
		{"default value", "a.sh", "vllm serve m --quantization ${Q:-fp8}\n", []string{"1:14 quantization-fp8-redirect"}},
		{"python list", "a.py", `subprocess.run(["vllm", "serve", "--quantization", "fp8"])` + "\n", []string{"1:34 quantization-fp8-redirect"}},
		{"python kwarg", "a.py", `llm = LLM(model="m", tokenizer_mode="slow")` + "\n", []string{"1:22 tokenizer-mode-slow"}},
		{"python dict as keywords", "a.py", `kw = {"quantization": "fp8"}` + "\nllm = LLM(model=\"m\", **kw)\n", []string{"1:7 quantization-fp8-redirect"}},
		{"python command string", "a.py", `cmd = "vllm serve m --quantization fp8"` + "\n", []string{"1:21 quantization-fp8-redirect"}},
		{"python shlex", "a.py", "args = shlex.split('''vllm serve m\n    --enable-mamba-fine-grained-prefix-cache''')\n", []string{"2:5 removed-flag/--enable-mamba-fine-grained-prefix-cache@0.31"}},
		{"yaml args", "d.yaml", "args:\n  - --quantization\n  - fp8\n", []string{"2:5 quantization-fp8-redirect"}},
		{"yaml flow args", "d.yaml", `args: ["--collect-detailed-traces", "model,worker"]` + "\n", []string{"1:8 removed-choice/--collect-detailed-traces=model,worker@0.31"}},
		{"yaml command string", "docker-compose.yml", "services:\n  e:\n    command: vllm serve m --tokenizer-mode slow\n", []string{"3:27 tokenizer-mode-slow"}},
		{"yaml config key", "c.yaml", "tokenizer_mode: slow\nquantization: fp8\n", []string{"1:1 tokenizer-mode-slow", "2:1 quantization-fp8-redirect"}},
		{"yaml folded block", "d.yaml", "cmd: >\n  vllm serve m\n  --quantization fp8\n", []string{"3:3 quantization-fp8-redirect"}},
		{"dockerfile exec", "Dockerfile", "FROM vllm/vllm-openai:v0.31.0\n" + `CMD ["--model", "m", "--quantization", "fp8"]` + "\n", []string{"2:22 quantization-fp8-redirect"}},
		{"dockerfile shell", "Dockerfile", "CMD vllm serve m \\\n  --tokenizer-mode=slow\n", []string{"2:3 tokenizer-mode-slow"}},
		{"unit exec", "v.service", "[Service]\nExecStart=/usr/bin/vllm serve m \\\n  --enable-mamba-fine-grained-prefix-cache\n", []string{"3:3 removed-flag/--enable-mamba-fine-grained-prefix-cache@0.31"}},
		{"bool kwarg true", "a.py", "EngineArgs(enable_mamba_fine_grained_prefix_cache=True)\n", []string{"1:12 removed-flag/--enable-mamba-fine-grained-prefix-cache@0.31"}},
		{"traces equals quoted", "a.sh", `vllm serve m --collect-detailed-traces="model,worker"` + "\n", []string{"1:14 removed-choice/--collect-detailed-traces=model,worker@0.31"}},
		{"mamba all", "a.py", `LLM(mamba_cache_mode="all")` + "\n", []string{"1:5 mamba-cache-mode-all-deprecated"}},
		{"shell comment", "a.sh", "#   vllm serve m --tokenizer-mode slow\n", []string{"1:18 tokenizer-mode-slow note"}},
		{"python comment", "a.py", `# LLM(model="m", quantization="fp8")` + "\n", []string{"1:18 quantization-fp8-redirect note"}},
		{"yaml comment", "d.yaml", "a: 1 # --quantization fp8 was ours\n", []string{"1:8 quantization-fp8-redirect note"}},
		{"unit comment", "v.service", "[Service]\n; ExecStart=vllm serve --tokenizer-mode slow\n", []string{"2:24 tokenizer-mode-slow note"}},
	})
}

func TestFlagNearMisses(t *testing.T) {
	runSpellings(t, []spelling{
		{"per tensor", "a.sh", "vllm serve m --quantization fp8_per_tensor\n", nil},
		{"per tensor equals", "a.sh", "vllm serve m --quantization=fp8_per_tensor -q fp8_e4m3\n", nil},
		{"other flag fp8", "a.sh", "vllm serve m --kv-cache-dtype fp8 --quantization-param-path fp8\n", nil},
		{"tokenizer auto", "a.sh", "vllm serve m --tokenizer-mode auto --tokenizer slow\n", nil},
		{"quoted as one word", "a.sh", "vllm serve m '--tokenizer-mode=auto' slow\n", nil},
		{"python per tensor", "a.py", `LLM(quantization="fp8_per_tensor", tokenizer_mode="slow_v2")` + "\n", nil},
		{"python expression", "a.py", `LLM(quantization=args.quantization)` + "\n", nil},
		{"bool kwarg false", "a.py", "EngineArgs(enable_mamba_fine_grained_prefix_cache=False)\n", nil},
		{"longer flag", "a.sh", "vllm serve m --enable-mamba-fine-grained-prefix-cache-v2\n", nil},
		{"traces one", "a.sh", "vllm serve m --collect-detailed-traces all\n", nil},
		{"mamba align", "a.yaml", "mamba_cache_mode: align\n", nil},
		{"yaml per tensor", "c.yaml", "quantization: fp8_per_tensor\nargs: [--quantization, fp8_per_tensor]\n", nil},
	})
}

func TestEnvSpellings(t *testing.T) {
	const x = "VLLM_PLE_CPU_OFFLOAD"
	hit := func(lc string) []string { return []string{lc + " removed-env/VLLM_PLE_CPU_OFFLOAD@0.31"} }
	runSpellings(t, []spelling{
		{"export", "a.sh", "export " + x + "=1\n", hit("1:8")},
		{"prefix assignment", "a.sh", x + "=1 vllm serve m\n", hit("1:1")},
		{"env command", "a.sh", "env " + x + "=1 vllm serve m\n", hit("1:5")},
		{"declare", "a.sh", "declare -x " + x + "\n", hit("1:12")},
		{"docker -e", "a.sh", "docker run -e " + x + " --env=X img\n", hit("1:15")},
		{"unit Environment", "v.service", "[Service]\nEnvironment=\"" + x + "=1\" B=2\n", hit("2:13")},
		{"unit UnsetEnvironment is a mention", "v.service", "[Service]\nUnsetEnvironment=" + x + "\n", []string{"2:18 removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 note"}},
		{"dockerfile ENV", "Dockerfile", "ENV A=1 " + x + "=1\n", hit("1:9")},
		{"dockerfile legacy ENV", "Dockerfile", "ENV " + x + " 1\n", hit("1:5")},
		{"compose list", "compose.yml", "environment:\n  - " + x + "=1\n", hit("2:5")},
		{"compose map", "compose.yml", "environment:\n  " + x + ": \"1\"\n", hit("2:3")},
		{"k8s name value", "k.yaml", "env:\n  - name: " + x + "\n    value: \"1\"\n", hit("2:11")},
		{".env", ".env", x + "=1\n", hit("1:1")},
		{"python environ set", "a.py", `os.environ["` + x + `"] = "1"` + "\n", hit("1:12")},
		{"python environ get is a mention", "a.py", `os.environ.get("` + x + `")` + "\n", []string{"1:16 removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 note"}},
		{"python getenv is a mention", "a.py", `os.getenv("` + x + `", "0")` + "\n", []string{"1:11 removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 note"}},
		{"python env dict", "a.py", `subprocess.run(cmd, env={"` + x + `": "1"})` + "\n", hit("1:26")},
		{"python dict kwarg", "a.py", "env = dict(os.environ, " + x + "=\"1\")\n", hit("1:24")},
		{"comment", "a.sh", "# " + x + " is gone\n", []string{"1:3 removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 note"}},
		{"reference is a mention", "a.sh", `echo "${` + x + `:-0}"` + "\n", []string{"1:7 removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 note"}},
		{"unset is a mention", "a.sh", "unset " + x + "\n", []string{"1:7 removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 note"}},
		{"test is a mention", "a.sh", `[ -n "$` + x + `" ] && echo on` + "\n", []string{"1:7 removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 note"}},
		{"python read is a mention", "a.py", `v = os.environ["` + x + `"]` + "\n", []string{"1:16 removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 note"}},
		{"python setdefault", "a.py", `os.environ.setdefault("` + x + `", "1")` + "\n", hit("1:23")},
		{"k8s value is not a name", "k.yaml", "env:\n  - name: FEATURE\n    value: " + x + "\n", nil},
		{"python string is not a setting", "a.py", `names = ["` + x + `"]` + "\n", nil},
		{"echo text", "a.sh", "echo " + x + "=1 is gone\n", nil},
		{"compose name only", "compose.yml", "services:\n  e:\n    environment:\n      - " + x + "\n", hit("4:9")},
		{"unit PassEnvironment", "v.service", "[Service]\nPassEnvironment=" + x + "\n", hit("2:17")},
		{"dockerfile ARG without default", "Dockerfile", "ARG " + x + "\n", []string{"1:5 removed-env/VLLM_PLE_CPU_OFFLOAD@0.31 note"}},
	})
}

func TestEnvNearMisses(t *testing.T) {
	runSpellings(t, []spelling{
		// A VLLM_ name no release reads is not the removed variable, but a likely typo of it.
		{"longer name", "a.sh", "export MY_VLLM_PLE_CPU_OFFLOAD=1 VLLM_PLE_CPU_OFFLOAD_V2=1\n", []string{"1:34 unknown-vllm-env"}},
		{"the deploy's own variables", "a.sh", "VLLM_ARGS='--port 8000'\nVLLM_MODEL=m\nvllm serve $VLLM_MODEL $VLLM_ARGS\n", nil},
		{"longer reference", "a.sh", `echo "$VLLM_PLE_CPU_OFFLOAD_OLD ${MY_VLLM_PLE_CPU_OFFLOAD}"` + "\n", nil},
		{"python longer", "a.py", `os.getenv("VLLM_PLE_CPU_OFFLOAD_OLD")` + "\n", nil},
		{"yaml longer", "k.yaml", "env:\n  - name: XVLLM_PLE_CPU_OFFLOAD\n", nil},
		{"word in a value", "a.sh", "echo VLLM_PLE_CPU_OFFLOAD_is_gone\n", nil},
	})
}

func TestModuleAndKeySpellings(t *testing.T) {
	const m = "vllm.entrypoints.openai.api_server"
	mod := func(lc string) []string {
		return []string{lc + " deprecated-module/vllm.entrypoints.openai.api_server@0.29"}
	}
	runSpellings(t, []spelling{
		{"python -m", "a.sh", "python -m " + m + " --model m\n", mod("1:11")},
		{"python3 -m continued", "a.sh", "python3 \\\n  -m " + m + "\n", mod("2:6")},
		{"uvicorn", "a.sh", "uvicorn " + m + ":app\n", mod("1:9")},
		{"exec form", "Dockerfile", `ENTRYPOINT ["python3", "-m", "` + m + `"]` + "\n", mod("1:30")},
		{"exec form CMD", "Dockerfile", "FROM python:3.11\n" + `CMD ["python3", "-m", "` + m + `", "--port", "8000"]` + "\n", mod("2:23")},
		{"exec form CMD on a vLLM image", "Dockerfile", "FROM vllm/vllm-openai:v0.31.0\n" + `CMD ["python3", "-m", "` + m + `", "--model", "m"]` + "\n", mod("2:23")},
		{"shell form CMD on a vLLM image", "Dockerfile", "FROM vllm/vllm-openai:v0.31.0\nCMD python3 -m " + m + " --model m\n", mod("2:16")},
		{"python list", "a.py", `subprocess.run(["python", "-m", "` + m + `"])` + "\n", mod("1:33")},
		{"import", "a.py", "import " + m + " as srv\n", mod("1:8")},
		{"from import", "a.py", "from vllm.entrypoints.openai import (protocol,\n    api_server)\n", mod("2:5")},
		{"run_module", "a.py", `runpy.run_module("` + m + `")` + "\n", mod("1:18")},
		{"curl body", "a.sh", `curl -d '{"model": "m", "mm_processor_kwargs": {}}' url` + "\n", []string{"1:25 request-mm-processor-kwargs"}},
		{"openai extra_body", "a.py", `c.create(extra_body={"media_io_kwargs": {}})` + "\n", []string{"1:22 request-media-io-kwargs"}},
		{"chat kwarg", "a.py", `llm.chat(msgs, mm_processor_kwargs={"num_crops": 4})` + "\n", []string{"1:16 request-mm-processor-kwargs"}},
		{"json body", "r.json", `{"mm_processor_kwargs": {"num_crops": 4}}`, []string{"1:2 request-mm-processor-kwargs"}},
	})
}

func TestModuleAndKeyNearMisses(t *testing.T) {
	runSpellings(t, []spelling{
		{"longer module", "a.sh", "python -m vllm.entrypoints.openai.api_server_utils\n", nil},
		{"sibling import", "a.py", "from vllm.entrypoints.openai import api_server_utils, protocol\n", nil},
		{"server flag", "a.sh", `vllm serve m --mm-processor-kwargs '{"num_crops": 4}'` + "\n", nil},
		{"engine kwarg", "a.py", `LLM(model="m", mm_processor_kwargs={"num_crops": 4})` + "\n", nil},
		{"engine args kwarg", "a.py", `AsyncEngineArgs(media_io_kwargs={})` + "\n", nil},
		{"longer key", "a.py", `default_mm_processor_kwargs = {"mm_processor_kwargs_v2": 1}` + "\n", nil},
		{"yaml server config", "c.yaml", "mm_processor_kwargs: {num_crops: 4}\n", nil},
	})
}
