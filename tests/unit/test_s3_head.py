"""``s3/head.py`` against moto: its answer reads as botocore's ``head_object`` reads it
(size, time, ETag, user metadata; odd keys), a missing object as botocore's 404, and
staging one object HEADs it this way. Real signatures and refusals (RGW):
tests/integration/test_s3.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from bbstage.movers import TransferError
from bbstage.movers.implementations.s3 import head
from bbstage.movers.implementations.s3.errors import translate
from bbstage.transfer import TransferSpec
from tests.helpers import run_worker, s3_sides
from tests.unit.test_s3_listing import ODD, _Fast


def ours(endpoint: str, bucket: str, key: str) -> dict[str, Any]:
    return asyncio.run(head.DirectHead(_Fast(endpoint)).head(bucket, key))  # type: ignore[arg-type]


def fields(answer: dict[str, Any]) -> tuple[Any, ...]:
    meta = {k.lower(): v for k, v in answer["Metadata"].items()}
    return answer["ContentLength"], answer["LastModified"], answer["ETag"], meta


@pytest.mark.parametrize("name", ODD)
def test_an_answer_reads_as_botocore_s(endpoint: str, client: Any, bucket: str, name: str) -> None:
    meta = {"bbstage-mtime-ns": "1700000000123456789", "Other": "v a+l"}
    client.put_object(Bucket=bucket, Key=name, Body=b"x" * len(name), Metadata=meta)
    answer = ours(endpoint, bucket, name)
    assert fields(answer) == fields(client.head_object(Bucket=bucket, Key=name))
    assert answer["Metadata"] == {"bbstage-mtime-ns": "1700000000123456789", "other": "v a+l"}
    assert answer["LastModified"].tzinfo is not None


def test_a_missing_object_reads_as_botocore_s_404(endpoint: str, client: Any, bucket: str) -> None:
    with pytest.raises(ClientError) as caught:
        ours(endpoint, bucket, "missing")
    with pytest.raises(ClientError) as botocore_s:
        client.head_object(Bucket=bucket, Key="missing")
    assert caught.value.response["Error"]["Code"] == "404"
    url = f"s3://{bucket}/missing"
    theirs = translate(botocore_s.value, url, "who", endpoint)
    assert str(translate(caught.value, url, "who", endpoint)) == str(theirs)


def test_staging_one_object_heads_it_without_botocore(
    endpoint: str, client: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.put_object(Bucket=bucket, Key="one", Body=b"one object")
    asked: list[str] = []
    real = head.DirectHead.head

    async def spy(self: Any, bucket: str, key: str) -> dict[str, Any]:
        asked.append(key)
        return await real(self, bucket, key)

    monkeypatch.setattr(head.DirectHead, "head", spy)
    extra = {"s3": {"endpoint_url": endpoint}, "credentials": {"key": "testing", "secret": "x"}}
    run_worker(
        TransferSpec.between(
            f"s3://{bucket}/one", str(tmp_path / "one"), job_id="h", **s3_sides(extra)
        )
    )
    assert asked == ["one"] and (tmp_path / "one").read_bytes() == b"one object"
    with pytest.raises(TransferError, match=f"no such object: s3://{bucket}/none"):
        run_worker(
            TransferSpec.between(
                f"s3://{bucket}/none", str(tmp_path / "x"), job_id="h", **s3_sides(extra)
            )
        )
    assert asked == ["one", "none"] and not (tmp_path / "x").exists()
