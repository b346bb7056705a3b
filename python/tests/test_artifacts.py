"""Compile artifacts on the engine side (weightcache/artifacts.py): a
cache directory packed and hashed, a set verified whole before anything is
written, and nothing written outside its directory or over the engine's
own files."""

import os

import pytest

from weightcache import artifacts, protocol


def _tree(base):
    files = {"inductor_cache/d6/k.main.so": b"\x7fELF" + bytes(range(200)), "inductor_cache/aa/g.py": b"x = 1\n",
             "inductor_cache/empty": b"", "rank_0_0/model": b"M" * 5000, "rank_1_0/model": b"other rank",
             "inductor_cache/locks/k.lock": b"", "rank_0_0/model.123.tmp": b"half"}
    for rel, data in files.items():
        p = os.path.join(base, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    os.chmod(os.path.join(base, "inductor_cache/d6/k.main.so"), 0o755)
    return files


def _packed(tmp_path):
    base = str(tmp_path / "src" / "torch_aot_compile" / "abc123")
    files = _tree(base)
    found = artifacts.scan(base, ["inductor_cache", "rank_0_0"])
    s, fd = artifacts.pack(base, found, key="abc123", dir="torch_aot_compile/abc123", rank="rank_0_0",
                           lookup="f" * 64, config={"dtype": "bfloat16"})
    return files, s, fd


def test_a_cache_directory_is_packed_without_locks_temporaries_or_other_ranks(tmp_path):
    files, s, fd = _packed(tmp_path)
    try:
        assert [f.path for f in s.files] == ["inductor_cache/aa/g.py", "inductor_cache/d6/k.main.so",
                                             "inductor_cache/empty", "rank_0_0/model"]
        assert s.bytes == sum(len(files[f.path]) for f in s.files) == os.fstat(fd).st_size
        assert {f.path: f.mode for f in s.files}["inductor_cache/d6/k.main.so"] == 0o755
        artifacts.check(artifacts.Set.from_wire(s.to_wire()))
    finally:
        os.close(fd)


def test_a_verified_set_is_written_byte_for_byte_and_the_engines_own_files_are_kept(tmp_path):
    files, s, fd = _packed(tmp_path)
    root = tmp_path / "dst"
    own = root / "torch_aot_compile/abc123/rank_0_0/model"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"vLLM's own")
    try:
        n, nbytes = artifacts.write(str(root), s, artifacts.verify(s, fd))
    finally:
        os.close(fd)
    assert (n, nbytes) == (3, sum(len(files[p]) for p in ("inductor_cache/aa/g.py", "inductor_cache/d6/k.main.so",
                                                          "inductor_cache/empty")))
    for f in s.files[:3]:
        got = root / "torch_aot_compile/abc123" / f.path
        assert got.read_bytes() == files[f.path]
        assert got.stat().st_mode & 0o777 == f.mode
    assert own.read_bytes() == b"vLLM's own"
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def test_an_altered_file_refuses_the_set_by_name(tmp_path):
    _, s, fd = _packed(tmp_path)
    try:
        os.pwrite(fd, b"\x00", s.files[0].size + 3)  # inside the second file
        with pytest.raises(artifacts.Refused, match="inductor_cache/d6/k.main.so has sha256"):
            artifacts.verify(s, fd)
        os.ftruncate(fd, s.bytes - 1)
        with pytest.raises(artifacts.Refused, match="holds"):
            artifacts.verify(s, fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "a//b", "./a", "", "a/\x00b", "a/."])
def test_a_path_that_could_leave_its_directory_is_refused(tmp_path, path):
    _, s, fd = _packed(tmp_path)
    os.close(fd)
    w = s.to_wire()
    w["files"][0]["path"] = path
    with pytest.raises(protocol.ProtocolError, match="clean relative path"):
        artifacts.Set.from_wire(w)


def test_a_set_whose_sizes_do_not_sum_is_refused(tmp_path):
    _, s, fd = _packed(tmp_path)
    os.close(fd)
    w = s.to_wire()
    w["bytes"] += 1
    with pytest.raises(protocol.ProtocolError, match="sum to"):
        artifacts.Set.from_wire(w)
    with pytest.raises(protocol.ProtocolError, match="malformed"):
        artifacts.Set.from_wire({"key": "k"})
