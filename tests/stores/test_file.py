"""File store specifics: atomic rename, no leftovers, key-path conflicts, tidy deletes."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from cachelib.stores import StoreError, open_store
from cachelib.stores.filestore import FileStore


def open_file_store(root: Path) -> FileStore:
    store = open_store(f"file://{root}")
    assert isinstance(store, FileStore)
    return store


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_objects_mirror_the_key_path(tmp_path: Path) -> None:
    store = open_file_store(tmp_path / "store")
    store.put("cc1/ns/name/obj", io.BytesIO(b"data"), 4)
    assert (tmp_path / "store/cc1/ns/name/obj").read_bytes() == b"data"
    assert all_files(tmp_path / "store") == ["cc1/ns/name/obj"]


def test_failed_publish_leaves_no_temporary_file(tmp_path: Path) -> None:
    store = open_file_store(tmp_path)
    with pytest.raises(ValueError, match="announced"):
        store.put("a/b", io.BytesIO(b"abc"), 10)
    assert all_files(tmp_path) == []


def test_temporary_files_of_a_publish_in_progress_are_not_listed(tmp_path: Path) -> None:
    store = open_file_store(tmp_path)
    store.put("a/b", io.BytesIO(b"1"), 1)
    (tmp_path / "a" / ".b.0123abcd.tmp").write_bytes(b"partial")
    assert [i.key for i in store.list()] == ["a/b"]


def test_a_key_cannot_be_both_object_and_prefix(tmp_path: Path) -> None:
    store = open_file_store(tmp_path)
    store.put("a/b", io.BytesIO(b"1"), 1)
    with pytest.raises(StoreError, match="parent of that key is itself an object"):
        store.put("a/b/c", io.BytesIO(b"2"), 1)
    store.put("x/y/z", io.BytesIO(b"3"), 1)
    with pytest.raises(StoreError, match="other objects live under that key"):
        store.put("x/y", io.BytesIO(b"4"), 1)
    assert all_files(tmp_path) == ["a/b", "x/y/z"]
    assert store.head("x/y") is None


def test_delete_removes_empty_directories_but_not_the_root(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = open_file_store(root)
    store.put("a/b/c", io.BytesIO(b"1"), 1)
    store.put("a/d", io.BytesIO(b"2"), 1)
    assert store.delete("a/b/c")
    assert not (root / "a/b").exists() and (root / "a/d").exists()
    assert store.delete("a/d")
    assert root.is_dir() and list(root.iterdir()) == []


def test_published_files_are_readable_by_others(tmp_path: Path) -> None:
    store = open_file_store(tmp_path)
    old = os.umask(0o022)
    try:
        store.put("k", io.BytesIO(b"1"), 1)
    finally:
        os.umask(old)
    assert (tmp_path / "k").stat().st_mode & 0o777 == 0o644


def test_empty_or_missing_root_lists_nothing(tmp_path: Path) -> None:
    store = open_file_store(tmp_path / "not-yet")
    assert list(store.list()) == []
    assert store.head("a") is None
    assert store.delete("a") is False
