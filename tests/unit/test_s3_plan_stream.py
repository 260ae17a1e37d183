"""A tree from S3 is planned a LIST page at a time: the next page is asked for only when
the copy reaches it, each directory comes before anything in it whatever the key order,
and the plan's memory does not grow with the number of objects."""

from __future__ import annotations

import datetime
import os
import tracemalloc
from typing import Any

import pytest

from bbstage.movers import FileTask, MoverOptions, TransferError
from bbstage.movers.implementations.s3 import listing
from bbstage.movers.implementations.s3.download import S3Download
from bbstage.movers.implementations.s3.settings import S3Options

CREDS = {"key": "testing", "secret": "testing"}


def mover(endpoint: str) -> S3Download:
    return S3Download(
        MoverOptions(source=S3Options(**{"s3": {"endpoint_url": endpoint}, "credentials": CREDS}))
    )


def counting(m: S3Download) -> list[str | None]:
    """Record the continuation token of each LIST page ``m`` asks for."""
    asked: list[str | None] = []
    real = m._list_page

    async def spy(bucket: str, prefix: str, token: str | None = None, limit: int = 0) -> Any:
        asked.append(token)
        return await real(bucket, prefix, token, limit)

    m._list_page = spy  # type: ignore[method-assign]
    return asked


def in_order(tasks: list[FileTask], dst: str) -> bool:
    """Each task's directory is ``dst`` or a directory task that came before it."""
    made = {dst}
    for t in tasks:
        if t.dst != dst and os.path.dirname(t.dst) not in made:
            return False
        if t.kind == "dir":
            made.add(t.dst)
    return True


def test_the_next_page_is_listed_when_the_copy_reaches_it(
    endpoint: str, client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(2100):
        client.put_object(Bucket=bucket, Key=f"t/d{i % 3}/{i:05d}", Body=b"x")
    lean: list[str] = []  # pages through s3/listing.py, the first one too
    real_page = listing.DirectList.page

    async def page(self: Any, *a: Any) -> Any:
        lean.append("page")
        return await real_page(self, *a)

    monkeypatch.setattr(listing.DirectList, "page", page)
    m = mover(endpoint)
    asked = counting(m)
    plan = iter(m.plan(f"s3://{bucket}/t/", "/dst/", tree=True, glob=False))
    assert len(asked) == 1  # the first page, to refuse an empty prefix at once
    tasks = [next(plan) for _ in range(1000)]
    assert len(asked) == 1
    tasks += list(plan)
    m.close()
    assert asked[0] is None and len(asked) == 3 and all(asked[1:]) and len(lean) == 3
    assert sorted(t.dst for t in tasks if t.kind == "file") == sorted(
        f"/dst/d{i % 3}/{i:05d}" for i in range(2100)
    )
    assert in_order(tasks, "/dst")


def test_directories_come_before_their_contents_whatever_the_key_order(
    endpoint: str, client: Any, bucket: str
) -> None:
    # "/" sorts after "-" and ".", before "0": a/'s own files come on both sides of a/b/.
    keys = ["a/b-x", "a/b.txt", "a/b/1", "a/b/c/2", "a/b0", "m/", "n/o//", "z/y/x/deep"]
    for k in keys:
        client.put_object(Bucket=bucket, Key=f"p/{k}", Body=b"x")
    m = mover(endpoint)
    tasks = list(m.plan(f"s3://{bucket}/p/", "/dst/", tree=True, glob=False))
    m.close()
    assert in_order(tasks, "/dst")
    dirs = [t.dst for t in tasks if t.kind == "dir"]
    assert len(dirs) == len(set(dirs))  # each made once
    assert {"/dst/m", "/dst/n/o", "/dst/a/b/c", "/dst/z/y/x"} <= set(dirs)


def test_an_empty_prefix_is_refused_when_planned(endpoint: str, bucket: str) -> None:
    m = mover(endpoint)
    with pytest.raises(TransferError, match="nothing under"):
        m.plan(f"s3://{bucket}/none/", "/dst/", tree=True, glob=False)
    m.close()


def test_an_unsafe_key_fails_the_plan_where_it_is_listed(
    endpoint: str, client: Any, bucket: str
) -> None:
    client.put_object(Bucket=bucket, Key="u/a", Body=b"x")
    client.put_object(Bucket=bucket, Key="u/b/../../x", Body=b"x")
    m = mover(endpoint)
    with pytest.raises(TransferError, match="not a safe relative path"):
        list(m.plan(f"s3://{bucket}/u/", "/dst/", tree=True, glob=False))
    m.close()


def test_the_plan_does_not_hold_the_listing() -> None:
    """200,000 keys (fake pages, no server): the memory the plan holds at its peak is that
    of a page or so, as for 20,000."""

    def peak(pages: int) -> int:
        m = mover("http://127.0.0.1:9")
        when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

        async def page(bucket: str, prefix: str, token: str | None = None, limit: int = 0) -> Any:
            n = int(token or 0)
            out: dict[str, Any] = {
                "Contents": [
                    {"Key": f"p/d{n % 7}/{n:04d}-{i:04d}", "Size": 1, "LastModified": when}
                    for i in range(1000)
                ]
            }
            if n + 1 < pages:
                out["NextContinuationToken"] = str(n + 1)
            return out

        m._list_page = page  # type: ignore[method-assign]
        tracemalloc.start()
        files = sum(t.kind == "file" for t in m.plan("s3://b/p/", "/dst/", tree=True, glob=False))
        high = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        m.close()
        assert files == pages * 1000
        return high

    small, big = peak(20), peak(200)
    assert big < 1.2 * small, (small, big)
