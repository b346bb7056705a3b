"""A PEP 517 build backend in the standard library alone, so that
`pip install ./python` works where setuptools cannot be downloaded (an
air-gapped venv, build isolation offline) or is absent (Python 3.12 venvs).
The package is pure Python: a wheel is a zip of weightcache/*.py and the
metadata read from pyproject.toml. PEP 660 editable installs get a .pth
file that points at this directory.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "weightcache"


def load_pyproject(text):
    """pyproject.toml as a dict: tomllib where it exists (3.11+), else the
    subset of TOML this project's file uses (tables, strings, string lists)."""
    try:
        import tomllib
        return tomllib.loads(text)
    except ImportError:
        return _mini_toml(text)


def _mini_toml(text):
    out, table = {}, None
    lines = iter(text.splitlines())
    for line in lines:
        line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
        if not line:
            continue
        if line.startswith("["):
            table = out
            for part in re.findall(r'"[^"]*"|[^.\[\]]+', line.strip("[]")):
                table = table.setdefault(part.strip('"'), {})
            continue
        key, _, value = (s.strip() for s in line.partition("="))
        while value.startswith("[") and not value.endswith("]"):
            value += next(lines).split(" #")[0].strip()
        if value.startswith("["):
            table[key.strip('"')] = re.findall(r'"([^"]*)"', value)
        else:
            table[key.strip('"')] = value.strip('"')
    return out


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        return load_pyproject(f.read())["project"]


def _metadata(p):
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p.get('description', '')}", f"Requires-Python: {p.get('requires-python', '')}"]
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    readme = os.path.join(ROOT, p.get("readme", "README.md"))
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    return "\n".join(lines) + "\n" + body


def _entry_points(p):
    out = []
    for group, eps in p.get("entry-points", {}).items():
        out.append(f"[{group}]")
        out += [f"{k} = {v}" for k, v in eps.items()]
    return "\n".join(out) + "\n"


def _sources():
    """Every module of the package and its subpackages, and the py.typed
    marker (PEP 561), as slash-separated paths under ROOT."""
    out = []
    for d, subdirs, names in os.walk(os.path.join(ROOT, PACKAGE)):
        subdirs[:] = [n for n in subdirs if n != "__pycache__"]
        rel = os.path.relpath(d, ROOT).replace(os.sep, "/")
        out += [f"{rel}/{n}" for n in names if n.endswith(".py") or n == "py.typed"]
    return sorted(out)


def _wheel(wheel_directory, files):
    """Write a py3-none-any wheel of files (archive name -> bytes) plus the
    metadata; returns its file name."""
    p = _project()
    dist = f"{p['name']}-{p['version']}"
    info = f"{dist}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = _metadata(p).encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: wcbuild\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/entry_points.txt"] = _entry_points(p).encode()
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files.items():
            z.writestr(zipfile.ZipInfo(arc, date_time=(2020, 2, 2, 0, 0, 0)), data)
    return name


def _read(rel):
    with open(os.path.join(ROOT, rel), "rb") as f:
        return f.read()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {rel: _read(rel) for rel in _sources()})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {f"_{PACKAGE}_editable.pth": (ROOT + "\n").encode()})


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    dist = f"{p['name']}-{p['version']}"
    name = f"{dist}.tar.gz"
    rels = ["pyproject.toml", "README.md", "build_backend/wcbuild.py"] + _sources()
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for rel in rels:
            data = _read(rel)
            ti = tarfile.TarInfo(f"{dist}/{rel}")
            ti.size, ti.mtime = len(data), 0
            tar.addfile(ti, io.BytesIO(data))
        pkg_info = _metadata(p).encode()
        ti = tarfile.TarInfo(f"{dist}/PKG-INFO")
        ti.size = len(pkg_info)
        tar.addfile(ti, io.BytesIO(pkg_info))
    return name
