"""What travels between Ray nodes (kbench.host.artifacts): only libraries inside the build
folder, unpacked only under the same key and sum, never rewriting a library in place."""

import json

from kbench.host import artifacts
from kbench.shared import manifest

KEY = {"source": "abc", "torch": "2.11", "arch": "9.0"}


def _built(folder, calls: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ext").mkdir(exist_ok=True)
    (folder / "ext" / "ext.so").write_bytes(b"library v1")
    (folder / manifest.MANIFEST).write_text(json.dumps({"calls": calls}))


def test_a_build_travels_and_replaces_what_was_there_without_rewriting_it(tmp_path):
    _built(tmp_path / "there", {"k": {"file": "ext/ext.so", "sha256": "x"}})
    artifact = artifacts.pack(tmp_path / "there", KEY)
    here = tmp_path / "here"
    _built(here, {})
    (here / "ext" / "ext.so").write_bytes(b"old library")
    with open(here / "ext" / "ext.so", "rb") as loaded:  # a worker has the old one open
        assert artifacts.install(artifact, here, KEY, 5) == ""
        assert loaded.read() == b"old library"
    assert (here / "ext" / "ext.so").read_bytes() == b"library v1"
    assert artifacts.shipped(here)


def test_another_key_or_sum_is_built_here_instead(tmp_path):
    _built(tmp_path / "there", {"k": {"file": "ext/ext.so", "sha256": "x"}})
    artifact = artifacts.pack(tmp_path / "there", KEY)
    why = artifacts.install(artifact, tmp_path / "here", {**KEY, "arch": "8.0"}, 5)
    assert "arch (9.0 there, 8.0 here)" in why
    forged = artifacts.Artifact(KEY, artifact.sha256, artifact.data + b"\0")
    assert "do not match" in artifacts.install(forged, tmp_path / "here", KEY, 5)
    assert not (tmp_path / "here").exists() or not artifacts.shipped(tmp_path / "here")


def test_a_manifest_naming_files_outside_its_folder_ships_nothing(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not the build's")
    for name in (str(secret), "../secret.txt", "ext/missing.so", 3):
        _built(tmp_path / "b", {"k": {"file": name, "sha256": "x"}})
        assert artifacts.pack(tmp_path / "b", KEY) is None, name
    (tmp_path / "b" / "ext" / "link.so").symlink_to(secret)
    _built(tmp_path / "b", {"k": {"file": "ext/link.so", "sha256": "x"}})
    assert artifacts.pack(tmp_path / "b", KEY) is None
