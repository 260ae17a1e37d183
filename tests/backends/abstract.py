"""The shared backend suite, in the style of fsspec's ``fsspec/tests/abstract/``: the cases
are written once, here, as methods of ``BackendSuite``; a backend adopts them with a few
lines (a subclass giving a ``store`` fixture, ``tests/backends/test_*.py``), against a real
server on 127.0.0.1.

Each case runs a whole transfer as a worker does (``worker.run``: plan, select, copy, the
manifest), between the store and a local directory, and checks bytes (digests), never an
exit code: file in and out, a tree in and out, ``checksum=``, the ``overwrite=`` rules,
cancel (nothing left behind), a missing source's message, a tree source that is a file and a
file source that is a directory, odd bytes in names, an empty file, and a file bigger than a
part (``LARGE``). A read-only store (https) skips the cases that write to it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from bbstage.transfer import Done, Failed, TransferSpec, worker
from tests.backends.stores import Store
from tests.helpers import Conn

LARGE = 12 << 20  # over S3's 5M parts (set below) and the generic mover's 4 MiB chunks
ODD = "odd name ü #%+=,;&'() ~.dat"  # spaces, UTF-8, characters URLs escape


def data(n: int, seed: int = 0) -> bytes:
    return os.urandom(n) if n > 4096 else bytes((i * 7 + seed) % 251 for i in range(n))


class BackendSuite:
    """The cases; a subclass provides ``store`` (a fixture returning a ``Store``)."""

    chunk = 4 << 20
    odd = ODD  # an adopter whose server cannot take a character names its own, and why
    resumes = True  # False: the store tells no modification time, a file is copied again
    directories = True  # False: a path without / is whatever the server answers there

    def data(self, n: int, seed: int = 0) -> bytes:
        """A body for a case; an adopter whose server mangles some bytes says which, and why."""
        return data(n, seed)

    def run(self, store: Store, src: str, dst: str, **fields: Any) -> list[Any]:
        """One transfer as a worker runs it; its events."""
        spec = self.spec(store, src, dst, **fields)
        conn = Conn()
        worker.transfer(spec, worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
        return conn.events

    def spec(self, store: Store, src: str, dst: str, **fields: Any) -> TransferSpec:
        spec = TransferSpec.between(src, dst, job_id="suite", chunk_size=self.chunk, **fields)
        side = {}
        if spec.source_kind == store.kind:
            side["source_options"] = store.options
        if spec.destination_kind == store.kind:
            side["destination_options"] = store.options
        return spec.but(**side)

    def done(self, events: list[Any]) -> Done:
        outcome = events[-1]
        assert isinstance(outcome, Done), outcome
        return outcome

    def failed(self, events: list[Any]) -> Failed:
        outcome = events[-1]
        assert isinstance(outcome, Failed), outcome
        return outcome

    def writable(self, store: Store, tmp_path: Path) -> bool:
        """Does the store take writes? A read-only one (https) must refuse a write, naming
        why, with nothing written: for it, that refusal is the case."""
        if not store.read_only:
            return True
        (tmp_path / "refused.dat").write_bytes(b"refused")
        before = store.names()
        failed = self.failed(self.run(store, str(tmp_path / "refused.dat"), store.url("r.dat")))
        assert "read-only" in failed.message, failed.message
        assert store.names() == before
        return False

    # -- files --------------------------------------------------------------------------

    def test_file_in(self, store: Store, tmp_path: Path) -> None:
        body = self.data(100_000)
        store.put("in/one.dat", body)
        done = self.done(self.run(store, store.url("in/one.dat"), str(tmp_path / "one.dat")))
        assert (tmp_path / "one.dat").read_bytes() == body
        assert (done.files, done.bytes) == (1, len(body))

    def test_file_out(self, store: Store, tmp_path: Path) -> None:
        if not self.writable(store, tmp_path):
            return
        body = self.data(100_000, 1)
        (tmp_path / "one.dat").write_bytes(body)
        self.done(self.run(store, str(tmp_path / "one.dat"), store.url("out/one.dat")))
        assert store.get("out/one.dat") == body
        assert store.names() == ["out/one.dat"]  # no temporary object left

    def test_empty_file_both_ways(self, store: Store, tmp_path: Path) -> None:
        store.put("empty", b"")
        self.done(self.run(store, store.url("empty"), str(tmp_path / "empty")))
        assert (tmp_path / "empty").read_bytes() == b""
        if not store.read_only:
            self.done(self.run(store, str(tmp_path / "empty"), store.url("back/empty")))
            assert store.get("back/empty") == b""

    def test_odd_bytes_in_names(self, store: Store, tmp_path: Path) -> None:
        body = self.data(5000, 2)
        odd = self.odd
        store.put(f"odd/{odd}", body)
        self.done(self.run(store, store.url(f"odd/{odd}"), str(tmp_path / odd)))
        assert (tmp_path / odd).read_bytes() == body
        if not store.read_only:
            self.done(self.run(store, str(tmp_path / odd), store.url(f"back/{odd}")))
            assert store.get(f"back/{odd}") == body

    def test_large_file_both_ways(self, store: Store, tmp_path: Path) -> None:
        body = self.data(LARGE)
        store.put("big/in.dat", body)
        done = self.done(self.run(store, store.url("big/in.dat"), str(tmp_path / "in.dat")))
        assert (tmp_path / "in.dat").read_bytes() == body and done.bytes == LARGE
        if not store.read_only:
            self.done(self.run(store, str(tmp_path / "in.dat"), store.url("big/out.dat")))
            assert store.get("big/out.dat") == body

    # -- trees --------------------------------------------------------------------------

    TREE = {"a.dat": 10, "sub/b.dat": 3000, "sub/deeper/c.dat": 70_000, "sub/d.dat": 0}

    def test_tree_in(self, store: Store, tmp_path: Path) -> None:
        """A tree, as its store lists it (an odd name among its files)."""
        bodies = {name: self.data(n, i) for i, (name, n) in enumerate(self.TREE.items())}
        bodies[f"sub/{self.odd}"] = self.data(100, 9)
        for name, body in bodies.items():
            store.put(f"tree/{name}", body)
        out = tmp_path / "tree"
        done = self.done(self.run(store, store.url("tree/"), f"{out}/"))
        got = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        assert got == bodies
        assert done.files == len(bodies)

    def test_wildcard_in(self, store: Store, tmp_path: Path) -> None:
        """A wildcard source: each file it matches, whole (its size as the store tells it,
        asked where a listing has none, never taken for 0), by its own name (an odd one),
        into the destination directory; a file it does not match is left."""
        bodies = {"a.dat": self.data(3000, 1), f"{self.odd}.dat": self.data(70_000, 2)}
        for name, body in bodies.items():
            store.put(f"w/{name}", body)
        store.put("w/skip.txt", b"not matched")
        out = tmp_path / "w"
        done = self.done(self.run(store, store.root + "w/*.dat", f"{out}/", glob=True))
        assert {p.name: p.read_bytes() for p in out.iterdir()} == bodies
        assert done.files == 2

    def test_tree_out(self, store: Store, tmp_path: Path) -> None:
        if not self.writable(store, tmp_path):
            return
        src = tmp_path / "tree"
        bodies = {name: self.data(n, i) for i, (name, n) in enumerate(self.TREE.items())}
        for name, body in bodies.items():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes(body)
        self.done(self.run(store, f"{src}/", store.url("up/")))
        assert {name: store.get(f"up/{name}") for name in bodies} == bodies

    # -- options ------------------------------------------------------------------------

    def test_checksum_both_ways(self, store: Store, tmp_path: Path) -> None:
        """Out with ``checksum=`` then back in with it (S3 verifies a download against the
        digest its upload stored: an object bbstage did not write is refused)."""
        body = self.data(300_000, 3)
        (tmp_path / "up.dat").write_bytes(body)
        if store.read_only:
            store.put("sum/out.dat", body)
        else:
            self.done(
                self.run(store, str(tmp_path / "up.dat"), store.url("sum/out.dat"), checksum="xxh3")
            )
            assert store.get("sum/out.dat") == body
        self.done(
            self.run(store, store.url("sum/out.dat"), str(tmp_path / "in.dat"), checksum="xxh3")
        )
        assert (tmp_path / "in.dat").read_bytes() == body

    def test_overwrite_rules_into_a_local_file(self, store: Store, tmp_path: Path) -> None:
        new = self.data(2000, 4)
        store.put("ow/f.dat", new)
        dst = tmp_path / "f.dat"
        dst.write_bytes(b"old")
        self.done(self.run(store, store.url("ow/f.dat"), str(dst), overwrite="never"))
        assert dst.read_bytes() == b"old"
        self.done(self.run(store, store.url("ow/f.dat"), str(dst), overwrite="always"))
        assert dst.read_bytes() == new
        # Already current: a second run copies nothing (resume).
        events = self.run(store, store.url("ow/f.dat"), str(dst))
        assert self.done(events).files == (0 if self.resumes else 1)
        assert dst.read_bytes() == new

    def test_overwrite_rules_into_the_store(self, store: Store, tmp_path: Path) -> None:
        if not self.writable(store, tmp_path):
            return
        store.put("ow/kept.dat", b"theirs")
        src = tmp_path / "kept.dat"
        src.write_bytes(b"mine, longer")
        self.done(self.run(store, str(src), store.url("ow/kept.dat"), overwrite="never"))
        assert store.get("ow/kept.dat") == b"theirs"
        self.done(self.run(store, str(src), store.url("ow/kept.dat"), overwrite="always"))
        assert store.get("ow/kept.dat") == b"mine, longer"
        os.utime(src, (1, 1))  # the source is older now: newer keeps the store's copy
        store.put("ow/kept.dat", b"theirs again")
        self.done(self.run(store, str(src), store.url("ow/kept.dat"), overwrite="newer"))
        assert store.get("ow/kept.dat") == b"theirs again"

    # -- failures -----------------------------------------------------------------------

    def test_missing_source_names_it(self, store: Store, tmp_path: Path) -> None:
        url = store.url("nothing/here.dat")
        failed = self.failed(self.run(store, url, str(tmp_path / "x")))
        assert "no such" in failed.message and url in failed.message, failed.message
        assert failed.permanent
        assert not (tmp_path / "x").exists()

    def test_a_tree_source_that_is_a_file_says_so(self, store: Store, tmp_path: Path) -> None:
        """``source=<store>/t/`` names a tree, and ``t`` is a file: the message says what to
        fix (as a POSIX source's does), not "no such file"."""
        store.put("nodir/t", b"a file")
        url = store.url("nodir/t") + "/"
        failed = self.failed(self.run(store, url, str(tmp_path / "x") + "/"))
        want = f"not a directory: {url[:-1]} (drop the trailing / to stage a file)"
        assert want in failed.message, failed.message
        assert failed.permanent
        assert not (tmp_path / "x").exists()

    def test_a_file_source_that_is_a_directory_says_so(self, store: Store, tmp_path: Path) -> None:
        """``source=<store>/d`` names a file, and ``d`` holds files: the message says what
        to fix, and nothing is written."""
        if not self.directories:
            return
        store.put("isdir/d/a.dat", b"a file")
        url = store.url("isdir/d")
        failed = self.failed(self.run(store, url, str(tmp_path / "x")))
        assert url in failed.message, failed.message
        assert "(end the source and destination with / to stage a tree)" in failed.message
        assert failed.permanent
        assert not (tmp_path / "x").exists()

    def test_cancel_leaves_nothing_behind(self, store: Store, tmp_path: Path) -> None:
        body = self.data(LARGE)
        store.put("cancel/in.dat", body)
        (tmp_path / "in.dat").write_bytes(body)
        out = tmp_path / "out"
        out.mkdir()
        for src, dst, where in [
            (store.url("cancel/in.dat"), str(out / "in.dat"), "local"),
            (str(tmp_path / "in.dat"), store.url("cancel/out.dat"), "store"),
        ]:
            if where == "store" and store.read_only:
                continue
            cancel = threading.Event()
            conn = Conn()
            spec = self.spec(store, src, dst)
            worker.transfer(spec, _StopAtFirstBytes(conn, cancel), cancel)  # type: ignore[arg-type]
            outcome = conn.events[-1]
            assert isinstance(outcome, Failed) and outcome.message == "cancelled", outcome
            # No temporary file, and no partial destination: absent, or whole (a copy that
            # ended before the cancel was seen).
            if where == "local":
                assert [p.name for p in out.iterdir() if p.name != "in.dat"] == []
                assert not (out / "in.dat").exists() or (out / "in.dat").read_bytes() == body
            else:
                assert [n for n in store.names() if n.startswith("cancel/")] in (
                    ["cancel/in.dat"],
                    ["cancel/in.dat", "cancel/out.dat"],
                )
                assert store.get("cancel/out.dat") in (None, body)


class _StopAtFirstBytes(worker.Reporter):
    """A worker's reporter that cancels the transfer once the first bytes moved."""

    def __init__(self, conn: Any, cancel: threading.Event) -> None:
        super().__init__(conn)
        self._cancel = cancel

    def add(self, nbytes: int) -> None:
        super().add(nbytes)
        self._cancel.set()
