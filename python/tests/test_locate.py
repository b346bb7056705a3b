"""checkpoint.locate: what a model name means, in the order Go's locate
takes it."""

import os
import shutil

from weightcache.checkpoint import locate, resolve


def test_an_existing_relative_directory_comes_before_a_hub_id(model, tmp_path, monkeypatch):
    """org/tiny is both a directory under the working directory and a
    repository in the hub cache: the directory is the checkpoint, as a
    path given on the command line is."""
    commit = "c" * 40
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    work = tmp_path / "work"
    shutil.copytree(model, work / "org" / "tiny")
    monkeypatch.chdir(work)
    directory, revision = locate("org/tiny")
    assert os.path.realpath(directory) == os.path.realpath(work / "org" / "tiny") and revision == ""
    assert os.path.realpath(resolve("org/tiny").dir) == os.path.realpath(work / "org" / "tiny")
    # Elsewhere the same name is the hub id.
    monkeypatch.chdir(tmp_path)
    assert locate("org/tiny") == (str(repo / "snapshots" / commit), commit)
