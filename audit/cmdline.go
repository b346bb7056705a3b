package audit

import (
	"path"
	"strings"
)

// A setting is vLLM's only where vLLM reads it: on a command line that runs
// vLLM, in the keywords of a vLLM constructor, or in a configuration that
// feeds one. recognise decides, from an argument list, which program it
// runs and where that program's own arguments start.

// prog is the program a command line runs, as far as the rules care.
type prog uint8

const (
	progNone        prog = iota // something else: echo, grep, sglang, a prose line
	progVLLM                    // vLLM's CLI, server module, image or engine keywords
	progWeightcache             // weightcache, whose preload takes the rendezvous port
)

// recog is what recognise found in an argument list.
type recog struct {
	prog prog
	// args is the index of the program's first argument.
	args int
	// module is the index of the module word of python -m or an ASGI
	// server (uvicorn m:app), or -1.
	module int
	// script is the index of a word that is a shell script of its own
	// (sh -c SCRIPT, eval), or -1.
	script int
	// env are the indices of NAME=value (or NAME) words the command
	// passes to the program: leading assignments, env, docker -e.
	env []int
	// envFiles are the indices of docker run --env-file values.
	envFiles []int
}

// wrappers run the rest of the line as a command; their own options are
// skipped. Values of the options listed in wrapperValueOpts are skipped too.
var wrappers = map[string]bool{
	"exec": true, "env": true, "nohup": true, "sudo": true, "time": true, "nice": true,
	"setsid": true, "stdbuf": true, "taskset": true, "timeout": true, "numactl": true,
	"chrt": true, "ionice": true, "command": true, "doas": true, "tini": true, "dumb-init": true,
	"gosu": true, "su-exec": true, "srun": true, "mpirun": true,
	// Shell words that a command follows on the same line.
	"then": true, "do": true, "else": true, "!": true, "{": true,
}

// runners run a command in an environment of theirs: uv run vllm serve.
var runners = map[string]bool{"uv": true, "poetry": true, "pipenv": true, "pdm": true, "hatch": true, "conda": true, "micromamba": true, "mamba": true, "pixi": true}

var wrapperValueOpts = map[string]bool{"-u": true, "-g": true, "-n": true, "-N": true, "-s": true, "-k": true, "--signal": true, "-C": true,
	"-p": true, "--name": true, "--prefix": true, "--env": true, "-e": true}

// shells run their -c argument as a script.
var shells = map[string]bool{"sh": true, "bash": true, "dash": true, "zsh": true, "ksh": true, "ash": true}

// containerRunners start an image: docker run IMAGE ARGS.
var containerRunners = map[string]bool{"docker": true, "podman": true, "nerdctl": true}

// dockerBoolOpts take no value; every other option of docker run does,
// unless written --opt=value.
var dockerBoolOpts = map[string]bool{
	"-d": true, "-i": true, "-t": true, "-it": true, "-ti": true, "-itd": true, "-dit": true, "-P": true,
	"--rm": true, "--detach": true, "--interactive": true, "--tty": true, "--privileged": true,
	"--init": true, "--read-only": true, "--publish-all": true, "--no-healthcheck": true, "--oom-kill-disable": true,
}

// isVLLMImage reports whether an image reference names a vLLM image, whose
// entrypoint is vLLM's server: vllm/vllm-openai, rocm/vllm, a mirror.
func isVLLMImage(ref string) bool {
	repo := ref
	if i := strings.IndexByte(repo, '@'); i >= 0 {
		repo = repo[:i]
	}
	last := path.Base(repo)
	if i := strings.IndexByte(last, ':'); i >= 0 {
		last = last[:i]
	}
	return strings.Contains(strings.ToLower(last), "vllm")
}

func isPython(p string) bool {
	if !strings.HasPrefix(p, "python") {
		return false
	}
	return strings.Trim(p[len("python"):], "0123456789.") == ""
}

// isVLLMModule: vllm, or anything under it (vllm.entrypoints.openai.api_server).
func isVLLMModule(m string) bool { return m == "vllm" || strings.HasPrefix(m, "vllm.") }

// recognise reads ws as one command line.
func recognise(ws []Word) recog {
	r := recog{module: -1, script: -1}
	i := 0
	for i < len(ws) {
		t := ws[i].Text
		if name, _, ok := splitAssign(t); ok && isIdent(name) {
			r.env = append(r.env, i)
			i++
			continue
		}
		p := path.Base(t)
		if runners[p] && i+1 < len(ws) && ws[i+1].Text == "run" {
			i++ // uv run, conda run -n env: then as a wrapper
		} else if !wrappers[p] {
			break
		}
		i++
		for i < len(ws) {
			o := ws[i].Text
			switch {
			case p == "env" && !strings.HasPrefix(o, "-"):
				if name, _, ok := splitAssign(o); ok && isIdent(name) {
					r.env = append(r.env, i)
					i++
					continue
				}
			case strings.HasPrefix(o, "-") && len(o) > 1:
				i++
				if wrapperValueOpts[o] && i < len(ws) {
					i++
				}
				continue
			case (p == "timeout" || p == "taskset" || p == "nice") && o != "" && strings.Trim(o, "0123456789.smhdxf,-") == "":
				i++ // a duration, CPU mask or niceness
				continue
			}
			break
		}
	}
	if i >= len(ws) {
		return r
	}
	p := path.Base(ws[i].Text)
	switch {
	case p == "vllm":
		r.prog, r.args = progVLLM, i+1
	case p == "weightcache":
		r.prog, r.args = progWeightcache, i+1
	case isPython(p) || (ws[i].Opaque && i+1 < len(ws) && ws[i+1].Text == "-m"):
		// python3 -m, or sys.executable -m in a Python argv.
		for j := i + 1; j < len(ws); j++ {
			t := ws[j].Text
			if t == "-m" && j+1 < len(ws) {
				r.module = j + 1
				if isVLLMModule(ws[j+1].Text) {
					r.prog, r.args = progVLLM, j+2
				}
				return r
			}
			if !strings.HasPrefix(t, "-") {
				return r // a script: python serve.py
			}
		}
	case p == "uvicorn" || p == "gunicorn" || p == "hypercorn":
		for j := i + 1; j < len(ws); j++ {
			if m, _, _ := strings.Cut(ws[j].Text, ":"); isDotted(m) {
				r.module = j
				return r
			}
		}
	case shells[p]:
		for j := i + 1; j+1 < len(ws); j++ {
			if t := ws[j].Text; strings.HasPrefix(t, "-") && !strings.HasPrefix(t, "--") && strings.Contains(t, "c") {
				r.script = j + 1
				return r
			}
		}
	case p == "eval":
		if i+1 < len(ws) {
			r.script = i + 1
		}
	case containerRunners[p]:
		return dockerRun(ws, i+1, r)
	}
	return r
}

// dockerRun reads docker run [OPTIONS] IMAGE [ARGS]: the image's own
// entrypoint is vLLM when the image is vLLM's, else ARGS is a command line.
func dockerRun(ws []Word, i int, r recog) recog {
	if i >= len(ws) || (ws[i].Text != "run" && ws[i].Text != "create") {
		return r
	}
	entrypoint := false
	for i++; i < len(ws); i++ {
		t := ws[i].Text
		if !strings.HasPrefix(t, "-") {
			break
		}
		name, _, inline := strings.Cut(t, "=")
		if name == "--entrypoint" {
			entrypoint = true
		}
		if name == "--env-file" && !inline && i+1 < len(ws) {
			r.envFiles = append(r.envFiles, i+1)
		}
		if name == "-e" || name == "--env" {
			if inline {
				r.env = append(r.env, i) // --env=NAME=value: the word holds both
			} else if i+1 < len(ws) {
				r.env = append(r.env, i+1)
			}
		}
		if !inline && !dockerBoolOpts[t] {
			i++
		}
	}
	if i >= len(ws) {
		return r
	}
	if isVLLMImage(ws[i].Text) && !entrypoint {
		r.prog, r.args = progVLLM, i+1
		return r
	}
	inner := recognise(ws[i+1:])
	if inner.prog != progNone {
		r.prog, r.args = inner.prog, inner.args+i+1
	}
	if inner.module >= 0 {
		r.module = inner.module + i + 1
	}
	if inner.script >= 0 {
		r.script = inner.script + i + 1
	}
	return r
}

// startsWithFlag reports whether an argument list is a fragment of flags,
// such as the value of VLLM_ARGS="--quantization fp8" or a Helm extraArgs.
func startsWithFlag(ws []Word) bool {
	return len(ws) > 0 && len(ws[0].Text) > 1 && ws[0].Text[0] == '-'
}
