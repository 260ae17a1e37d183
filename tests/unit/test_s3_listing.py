"""``s3/listing.py`` against moto: its pages read as botocore's ``list_objects_v2`` reads
them, key for key (odd bytes included), page for page; an error answer reads as botocore's.
Real signatures (RGW, an odd prefix): tests/integration/test_s3.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from botocore.exceptions import ClientError

from bbstage.movers.implementations.s3 import listing
from bbstage.movers.implementations.s3.errors import translate
from bbstage.movers.implementations.s3.settings import S3Settings

ODD = ["a b", "ctl\x01x", "plus+sign", "é-ü", "percent%41", "a//b", "dir/", "amp&<lt>", "q?x#h"]


class _Fast:
    """What DirectList asks of ``FastS3``."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint, self.region = endpoint, "us-east-1"
        self.settings = S3Settings()

    async def credentials(self) -> tuple[str, str, str | None]:
        return "testing", "testing", None


def pages(endpoint: str, bucket: str, prefix: str, limit: int = 0) -> list[dict[str, Any]]:
    lister = listing.DirectList(_Fast(endpoint))  # type: ignore[arg-type]

    async def run() -> list[dict[str, Any]]:
        out, token = [], None
        while True:
            page = await lister.page(bucket, prefix, token, limit)
            out.append(page)
            token = page.get("NextContinuationToken")
            if not token:
                return out

    return asyncio.run(run())


def botocore_pages(client: Any, bucket: str, prefix: str, limit: int = 0) -> list[dict[str, Any]]:
    out, kw = [], {"Bucket": bucket, "Prefix": prefix, **({"MaxKeys": limit} if limit else {})}
    while True:
        page = client.list_objects_v2(**kw)
        out.append(page)
        if not page.get("NextContinuationToken"):
            return out
        kw["ContinuationToken"] = page["NextContinuationToken"]


def fields(page: dict[str, Any]) -> list[tuple[str, int, Any, str]]:
    return [(o["Key"], o["Size"], o["LastModified"], o["ETag"]) for o in page.get("Contents", [])]


@pytest.mark.parametrize("prefix", ["p/", "odd prefix é/"])
def test_keys_read_as_botocore_reads_them(
    endpoint: str, client: Any, bucket: str, prefix: str
) -> None:
    for n, name in enumerate(ODD):
        client.put_object(Bucket=bucket, Key=prefix + name, Body=b"x" * n)
    client.put_object(Bucket=bucket, Key="other/k", Body=b"")
    ours, theirs = pages(endpoint, bucket, prefix), botocore_pages(client, bucket, prefix)
    assert len(ours) == len(theirs) == 1
    assert fields(ours[0]) == fields(theirs[0])
    assert sorted(k for k, *_ in fields(ours[0])) == sorted(prefix + n for n in ODD)
    assert all(o["LastModified"].tzinfo is not None for o in ours[0]["Contents"])


def test_pages_follow_the_continuation_tokens(endpoint: str, client: Any, bucket: str) -> None:
    for i in range(25):
        client.put_object(Bucket=bucket, Key=f"t/{i:03d}", Body=b"")
    ours, theirs = pages(endpoint, bucket, "t/", 10), botocore_pages(client, bucket, "t/", 10)
    assert [fields(p) for p in ours] == [fields(p) for p in theirs]
    assert [len(p["Contents"]) for p in ours] == [10, 10, 5]


def test_nothing_under_the_prefix_is_a_page_without_contents(
    endpoint: str, client: Any, bucket: str
) -> None:
    assert pages(endpoint, bucket, "none/") == [{}]
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix="none/")


def test_an_error_answer_reads_as_botocore_s(endpoint: str) -> None:
    with pytest.raises(ClientError) as caught:
        pages(endpoint, "no-such-bucket-here", "p/")
    assert caught.value.response["Error"]["Code"] == "NoSuchBucket"
    err = translate(caught.value, "s3://no-such-bucket-here/p/", "who", endpoint)
    assert "no such bucket" in str(err) and err.permanent


def test_a_page_without_namespace_or_encoding_is_read_as_it_is() -> None:
    body = (
        b"<ListBucketResult><Contents><Key>a%20b</Key><Size>3</Size>"
        b"<LastModified>2026-11-24T06:53:00.123Z</LastModified><ETag>&quot;e&quot;</ETag>"
        b"</Contents><NextContinuationToken>tok</NextContinuationToken></ListBucketResult>"
    )
    page = listing.parse(body)
    assert page["NextContinuationToken"] == "tok"
    [obj] = page["Contents"]
    assert (obj["Key"], obj["Size"], obj["ETag"]) == ("a%20b", 3, '"e"')
    assert obj["LastModified"].isoformat() == "2026-11-24T06:53:00.123000+00:00"
