"""Facts of one vLLM release for weightcache audit, read from its own code.

Run with the release's source first on PYTHONPATH and the project's vLLM
environment after it (scripts/audit-facts.sh does); prints JSON:

- every option of `vllm serve` and `vllm preload` as the release's parser
  builds it (choices, default, whether it takes a value, deprecation), with
  the file and line of its add_argument call, and the deprecations the
  parser prints while it reads a command line;
- every variable envs.py reads, with a hash of its definition (its own name
  blanked: renames are found by comparing definitions across releases) and
  choices where it declares them;
- vLLM modules that run as `python -m`, and the deprecation they print;
- the Literal types of vllm/config (values of settings the parser takes as
  plain strings);
- the --model-loader-extra-config keys the ipc_cache loader and vLLM's
  DefaultModelLoader take.

Only what the release's code says goes in: the audit's rules are derived
from these facts, and tested against them.

With --plugin it prints instead the keys the weightcache loader plugin
takes, read through parse_options (python/tests/test_audit_keys.py holds
the committed copy to the plugin).
"""

from __future__ import annotations

import argparse
import ast
import enum
import hashlib
import json
import os
import re
import sys
from typing import Any

REMOVAL = re.compile(r"removed in (?:vLLM )?v?(\d+\.\d+)")


def rel(path: str, root: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def record_calls(root: str) -> dict[int, tuple[str, int]]:
    """Patch add_argument to remember where each action was declared: the
    first frame inside vllm/ that is not argparse plumbing."""
    where: dict[int, tuple[str, int]] = {}
    orig = argparse._ActionsContainer.add_argument

    def add_argument(self, *args, **kwargs):
        action = orig(self, *args, **kwargs)
        f = sys._getframe(1)
        while f is not None:
            fn = f.f_code.co_filename
            if fn.startswith(root) and not fn.endswith("argparse_utils.py"):
                where[id(action)] = (rel(fn, root), f.f_lineno)
                break
            f = f.f_back
        return action

    argparse._ActionsContainer.add_argument = add_argument
    return where


def jsonable(v: Any) -> Any:
    """A default as JSON; a config object by its type only (<EPLBConfig>):
    its repr changes with every field vLLM adds, which is not a change of
    the option."""
    if isinstance(v, enum.Enum):
        return jsonable(v.value)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float, str)) for x in v):
        return list(v)
    return "<%s>" % type(v).__name__


def options(parser: argparse.ArgumentParser, where: dict, deprecated: set) -> list[dict]:
    out = []
    for a in parser._actions:
        flags = [s for s in a.option_strings if s.startswith("-")]
        if not flags or isinstance(a, argparse._HelpAction):
            continue
        help_text = a.help if isinstance(a.help, str) else ""
        o: dict[str, Any] = {
            "flags": sorted(flags, key=lambda s: (not s.startswith("--"), s)),
            "dest": a.dest,
            "takes_value": a.nargs != 0,
            "default": jsonable(a.default),
        }
        if a.nargs not in (None, 0):
            o["nargs"] = str(a.nargs)
        if a.choices is not None:
            o["choices"] = sorted(str(c) for c in a.choices)
        dep = a in deprecated or bool(re.search(r"\bdeprecated\b", help_text, re.I))
        if dep:
            o["deprecated"] = " ".join(help_text.split()) or "argument '%s' is deprecated" % a.dest
            m = REMOVAL.search(help_text)
            if m:
                o["removed_in"] = m.group(1)
        file, line = where.get(id(a), ("", 0))
        o["file"], o["line"] = file, line
        out.append(o)
    out.sort(key=lambda o: o["flags"][0])
    return out


def parsers(root: str) -> dict[str, list[dict]]:
    where = record_calls(root)
    from vllm import platforms
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # The vllm wheel (0.33) is the CUDA build: with no GPU here its config
    # defaults cannot infer a device. vLLM's own CLI falls back to the CPU
    # platform the same way for `vllm bench` (vllm/entrypoints/cli/main.py).
    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()

    top = FlexibleArgumentParser()
    sub = top.add_subparsers(dest="subparser")
    cmds = {}
    import importlib.util

    for name in ("serve", "preload"):
        if importlib.util.find_spec("vllm.entrypoints.cli." + name) is None:
            continue  # preload came in 0.31
        mod = importlib.import_module("vllm.entrypoints.cli." + name)
        for c in mod.cmd_init():
            if c.name == name:
                cmds[name] = c.subparser_init(sub)
    out = {}
    for name, p in cmds.items():
        out[name] = options(p, where, getattr(p, "_deprecated", set()))
    return out


FLAG = re.compile(r"`?(--[a-z][a-z0-9-]+)`?")


def cli_deprecations(root: str) -> list[dict]:
    """Deprecations the argument parser itself prints while it reads the
    command line (FlexibleArgumentParser.parse_args), not in an option's
    help: `vllm serve --model m` warns that --model will go."""
    path = os.path.join(root, "vllm", "utils", "argparse_utils.py")
    out = []
    for node in ast.walk(ast.parse(open(path).read())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("warning", "warn", "warning_once")):
            continue
        text = " ".join(ast.literal_eval(a) for a in node.args if _is_str(a))
        if not re.search(r"deprecated|will be removed", text):
            continue
        flags = FLAG.findall(text)
        if not flags:
            continue
        d: dict[str, Any] = {"flag": flags[-1], "message": " ".join(text.split()), "file": rel(path, root), "line": node.lineno}
        if "`vllm serve`" in text:
            d["command"] = "serve"
        out.append(d)
    return out


def env_vars(root: str) -> list[dict]:
    path = os.path.join(root, "vllm", "envs.py")
    tree = ast.parse(open(path).read())
    out = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign):
            target = node.target
        if not (isinstance(target, ast.Name) and target.id == "environment_variables"
                and isinstance(node.value, ast.Dict)):
            continue
        for k, v in zip(node.value.keys, node.value.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                continue
            name = k.value
            # The definition with its own name blanked out: a variable
            # renamed with the same meaning keeps the same definition.
            definition = ast.unparse(v).replace(repr(name), "'$NAME'").replace('"%s"' % name, "'$NAME'")
            digest = hashlib.sha256(definition.encode()).hexdigest()[:12]
            e: dict[str, Any] = {"name": name, "file": "vllm/envs.py", "line": k.lineno, "definition": digest}
            if isinstance(v, ast.Call) and getattr(v.func, "id", "").startswith("env_") and len(v.args) >= 3:
                try:
                    e["choices"] = sorted(str(c) for c in ast.literal_eval(v.args[2]))
                except ValueError:
                    pass
            out.append(e)
    out.sort(key=lambda e: e["name"])
    return out


GETENV = re.compile(r"""(?:getenv|environ\.get|environ\[|environ\.setdefault)\(?\s*["'](VLLM_[A-Z0-9_]+)["']""")


def env_elsewhere(root: str, known: set[str]) -> list[str]:
    """VLLM_ variables read outside envs.py: not worth rules, but setting
    one is not a typo."""
    names = set()
    for d, _, files in os.walk(os.path.join(root, "vllm")):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(d, f), errors="replace") as fh:
                    names.update(GETENV.findall(fh.read()))
    return sorted(names - known)


MAIN = ("__name__ == '__main__'", '__name__ == "__main__"')


def modules(root: str) -> list[dict]:
    """Entry points under vllm/entrypoints that run as python -m, and the
    DeprecationWarning each prints."""
    out = []
    base = os.path.join(root, "vllm", "entrypoints")
    for d, _, files in os.walk(base):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            tree = ast.parse(open(path).read())
            main = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) in MAIN]
            if not main:
                continue
            name = rel(path, root)[:-3].replace("/", ".")
            m: dict[str, Any] = {"name": name, "file": rel(path, root), "line": 1}
            # What python -m prints comes first: the warning of the main
            # block, then one the module prints when imported.
            for node in [*ast.walk(main[0]), *ast.walk(tree)]:
                if isinstance(node, ast.Call) and "DeprecationWarning" in ast.unparse(node) \
                        and getattr(node.func, "attr", getattr(node.func, "id", "")) == "warn":
                    text = " ".join(ast.literal_eval(a) for a in node.args if _is_str(a))
                    m["deprecated"] = " ".join(text.split())
                    m["line"] = node.lineno
                    r = REMOVAL.search(text)
                    if r:
                        m["removed_in"] = r.group(1)
                    break
            out.append(m)
    out.sort(key=lambda m: m["name"])
    return out


def _is_str(a: ast.AST) -> bool:
    try:
        return isinstance(ast.literal_eval(a), str)
    except ValueError:
        return False


def literals(root: str) -> dict[str, dict]:
    """The Literal[...] types of vllm/config: the values a setting takes
    when its option lists no choices (--tokenizer-mode is a str to the
    parser, TokenizerMode to the config)."""
    out = {}
    base = os.path.join(root, "vllm", "config")
    for f in sorted(os.listdir(base)):
        if not f.endswith(".py"):
            continue
        path = os.path.join(base, f)
        for node in ast.parse(open(path).read()).body:
            if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Subscript) and getattr(node.value.value, "id", "") == "Literal"):
                continue
            elts = node.value.slice.elts if isinstance(node.value.slice, ast.Tuple) else [node.value.slice]
            values = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if values:
                out[node.targets[0].id] = {"values": sorted(values), "file": rel(path, root), "line": node.lineno}
    return out


def loader_keys(root: str) -> dict[str, dict]:
    out = {}
    ml = os.path.join(root, "vllm", "model_executor", "model_loader")
    ipc = os.path.join(ml, "weight_cache", "ipc_loader.py")
    if os.path.exists(ipc):
        out["ipc_cache"] = ipc_keys(ipc, root)
    default = os.path.join(ml, "default_loader.py")
    for node in ast.walk(ast.parse(open(default).read())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "allowed_keys":
            out["auto"] = {"file": rel(default, root), "line": node.lineno,
                           "keys": {k: {"type": "any"} for k in sorted(ast.literal_eval(node.value))}}
    return out


def ipc_keys(path: str, root: str) -> dict:
    """The keys IpcModelLoader.__init__ pops from the extra config; what is
    left makes it raise. A key's type is read from its default and from the
    check the constructor makes on it."""
    tree = ast.parse(open(path).read())
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    keys: dict[str, dict] = {}
    line = 0
    for node in ast.walk(tree):
        if not (isinstance(node, ast.FunctionDef) and node.name == "__init__"):
            continue
        src = ast.unparse(node)
        line = node.lineno
        for call in ast.walk(node):
            if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "pop"
                    and getattr(call.func.value, "id", "") == "extra_config" and call.args):
                continue
            name = ast.literal_eval(call.args[0])
            dflt = call.args[1] if len(call.args) > 1 else None
            if isinstance(dflt, ast.Name):
                value = consts.get(dflt.id)
            else:
                value = ast.literal_eval(dflt) if dflt is not None else None
            k: dict[str, Any] = {"line": call.lineno, "default": value}
            choices = re.search(r"self\.%s not in \(([^)]*)\)" % re.escape(name), src)
            if choices:
                k["type"], k["choices"] = "choice", sorted(ast.literal_eval("(" + choices.group(1) + ")"))
            elif isinstance(value, bool) or "bool(extra_config.pop(%r" % name in src:
                k["type"] = "bool"
            elif isinstance(value, (int, float)):
                k["type"] = "seconds" if name.endswith("_s") else "number"
            else:
                k["type"] = "string"
            keys[name] = k
    return {"file": rel(path, root), "line": line, "default_mode": keys.get("mode", {}).get("default"), "keys": keys}


def plugin() -> dict:
    """The weightcache plugin's keys, probed through parse_options: a key
    lands in Options (not in what is left for vLLM) only if the plugin takes
    it, and its type is what parse_options accepts."""
    import dataclasses

    from weightcache.vllm import LOAD_FORMAT, Options, parse_options

    keys: dict[str, dict] = {}
    probes = {"bool": True, "seconds": 1.5, "string": "x"}
    for f in dataclasses.fields(Options):
        for t, v in probes.items():
            try:
                o, rest = parse_options({f.name: v})
            except ValueError:
                continue
            if f.name not in rest and getattr(o, f.name) == v:
                keys[f.name] = {"type": t, "default": f.default}
                break
        else:
            # A string key that refuses "x" has choices: the default is one,
            # the others are what the error lists.
            try:
                parse_options({f.name: "\x00"})
            except ValueError as e:
                listed = re.findall(r"[a-z_]+", str(e).split("want", 1)[1])
                ok = []
                for c in listed:
                    try:
                        parse_options({f.name: c})
                        ok.append(c)
                    except ValueError:
                        pass
                keys[f.name] = {"type": "choice", "choices": sorted(ok), "default": f.default}
    return {"load_format": LOAD_FORMAT, "source": "python/weightcache (parse_options)", "keys": keys}


def main() -> None:
    # vLLM's logger writes to stdout, which carries the JSON: it gets stderr.
    out, sys.stdout = sys.stdout, sys.stderr
    if sys.argv[1:] == ["--plugin"]:
        write(out, plugin())
        return
    version, package = sys.argv[1], sys.argv[2]
    import vllm

    root = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
    env = env_vars(root)
    facts = {
        "version": version,
        "package": package,
        "commands": parsers(root),
        "cli_deprecations": cli_deprecations(root),
        "env": env,
        "env_elsewhere": env_elsewhere(root, {e["name"] for e in env}),
        "modules": modules(root),
        "loaders": loader_keys(root),
        "literals": literals(root),
    }
    write(out, facts)


def write(w: Any, v: Any, depth: int = 0) -> None:
    """JSON with one option, variable or module a line, so that a review
    of a regenerated file reads as a list of changes."""
    pad = " " * depth
    if isinstance(v, dict) and depth < 2:
        items = sorted(v.items())
        w.write("{\n")
        for i, (k, x) in enumerate(items):
            w.write(pad + " " + json.dumps(k) + ": ")
            write(w, x, depth + 1)
            w.write(",\n" if i < len(items) - 1 else "\n")
        w.write(pad + "}")
    elif isinstance(v, list) and v and isinstance(v[0], dict):
        w.write("[\n")
        for i, x in enumerate(v):
            w.write(pad + " " + json.dumps(x, sort_keys=True))
            w.write(",\n" if i < len(v) - 1 else "\n")
        w.write(pad + "]")
    else:
        w.write(json.dumps(v, sort_keys=True))
    if depth == 0:
        w.write("\n")

if __name__ == "__main__":
    main()
