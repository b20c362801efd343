"""node/puts.py: the notes of puts in progress, and what NodeService does with them (no FUSE needed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gmountpy.node.export import Export
from gmountpy.node.puts import PutJournal
from gmountpy.node.service import NodeService


@pytest.fixture
def export(tmp_path: Path) -> Iterator[Export]:
    (tmp_path / "export" / "d").mkdir(parents=True)
    opened = Export(str(tmp_path / "export"))
    yield opened
    opened.close()


def test_the_temporary_of_a_put_left_by_a_crash_is_removed_at_start(tmp_path: Path, export: Export) -> None:
    root = Path(export.root)
    (root / "d" / ".x.gmount-put-1234abcd").write_bytes(b"half a put")
    (root / "d" / "x").write_bytes(b"the file before the put")
    notes = str(tmp_path / "puts")
    PutJournal(notes).begin("/d/.x.gmount-put-1234abcd")  # then the daemon was killed
    PutJournal(notes).begin("/d/.y.gmount-put-00000000")  # killed before the file was made
    NodeService(export, {}, puts=PutJournal(notes))
    assert os.listdir(root / "d") == ["x"]
    assert (root / "d" / "x").read_bytes() == b"the file before the put"
    assert PutJournal(notes).leftovers() == [] and os.listdir(notes) == []


def test_a_note_that_names_no_put_temporary_never_removes_a_file(tmp_path: Path, export: Export) -> None:
    root = Path(export.root)
    (root / "d" / "precious").write_bytes(b"data")
    notes = tmp_path / "puts"
    notes.mkdir()
    (notes / "bogus").write_bytes(b"/d/precious")
    NodeService(export, {}, puts=PutJournal(str(notes)))
    assert (root / "d" / "precious").read_bytes() == b"data"
    assert os.listdir(notes) == []


def test_a_put_in_progress_is_in_no_lookup_nor_listing_and_its_note_goes_when_it_ends(
        tmp_path: Path, export: Export) -> None:
    root = Path(export.root)
    journal = PutJournal(str(tmp_path / "puts"))
    service = NodeService(export, {}, puts=journal)
    (root / "d" / "seen").write_bytes(b"1")
    temporary = "/d/.new.gmount-put-0badf00d"
    journal.begin(temporary)
    (root / "d" / ".new.gmount-put-0badf00d").write_bytes(b"partial")
    assert service.lookup(temporary) is None
    listing = service.listing("/d")
    assert listing is not None and [entry.name for entry in listing] == ["seen"]
    assert len(os.listdir(tmp_path / "puts")) == 1
    journal.end(temporary)
    assert service.lookup(temporary) is None  # a put's temporary by its name, whoever left it
    assert os.listdir(tmp_path / "puts") == []


def test_only_a_put_temporary_can_be_noted(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        PutJournal(str(tmp_path / "puts")).begin("/d/x")
