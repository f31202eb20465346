"""The package's one way to write a file another process reads
(python/vramguard/_files.py): whole or not at all, synced before the
rename, an old file's permission bits kept, nothing left beside it."""
import os
import stat

import pytest

from vramguard import _files


def test_a_new_file_is_written_whole(tmp_path):
    _files.write_atomically(tmp_path / "a.json", '{"x": 1}')
    assert (tmp_path / "a.json").read_text() == '{"x": 1}'
    assert os.listdir(tmp_path) == ["a.json"]


def test_a_replaced_file_keeps_its_bits(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    _files.write_atomically(path, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        _files.write_atomically(path, b"new")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.bin"]


def test_the_data_is_synced_before_the_rename(tmp_path, monkeypatch):
    order = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append("replace"), real_replace(a, b))[1])
    _files.write_atomically(tmp_path / "a", b"x")
    _files.commit_file(str(tmp_path / "a"), str(tmp_path / "b"))
    assert order == ["fsync", "replace", "fsync", "replace"]
    assert (tmp_path / "b").read_bytes() == b"x" and not (tmp_path / "a").exists()


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
    (tmp_path / "elsewhere").write_text("keep")
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    _files.write_atomically(tmp_path / "link", "new")
    assert (tmp_path / "elsewhere").read_text() == "keep"
    assert not os.path.islink(tmp_path / "link") and (tmp_path / "link").read_text() == "new"


def test_an_unwritable_folder_names_the_target(tmp_path):
    with pytest.raises(FileNotFoundError) as refused:
        _files.write_atomically(tmp_path / "missing" / "a", "x")
    assert refused.value.filename == str(tmp_path / "missing" / "a")
