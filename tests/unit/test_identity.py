"""``identity.unlink_as``: the one way root removes files as a user (a killed worker's, a
failed Dask child's, a lost job's leftovers)."""

from __future__ import annotations

import os
from pathlib import Path

from bbstage.identity import Identity, unlink_as

NOBODY = 65534


def test_files_are_removed_as_the_user_never_as_root(area: Path) -> None:
    """In a sticky directory the user removes their own files and no one else's: had root
    removed them, root's file would be gone too. A name that is no UTF-8 goes as well."""
    theirs = area / ".a.part"
    odd = Path(os.fsdecode(bytes(area) + b"/.\xff.part"))
    roots = area / ".b.part"
    for path in (theirs, odd, roots):
        path.write_bytes(b"partial")
    os.chown(theirs, NOBODY, NOBODY)
    os.chown(odd, NOBODY, NOBODY)
    unlink_as(Identity(NOBODY, NOBODY, ()), [str(theirs), str(odd), str(roots), str(area / "x")])
    assert sorted(p.name for p in area.iterdir()) == [".b.part"]
    assert roots.read_bytes() == b"partial"
