"""``bbstage bench``: small data sets through the real worker, baselines, JSON, cleanup, plot."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest
import structlog

from bbstage import bench
from bbstage.cli import main as cli

from .s3env import S3Env, s3

__all__ = ["s3"]  # fixture


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["--config", "/nonexistent/bbstage.toml", "bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    return src, dst


def test_tree_json_baselines_and_cleanup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = dirs(tmp_path)
    before = structlog.get_config()
    code, out, err = run_cli(
        capsys,
        *("--source", str(src), "--destination", str(dst)),
        *("--files", "50", "--file-size", "4K", "--cache", "warm", "--repeat", "2", "--json"),
    )
    assert code == 0, err
    r = json.loads(out)
    assert r["files"] == 50 and r["file_size"] == 4096 and r["total_bytes"] == 50 * 4096
    # Its logging (warnings, on stderr) was for its run only: a later test of this process
    # that logs must not write to this test's captured (then closed) stderr.
    assert structlog.get_config() == before
    assert r["mb_per_s"] > 0 and r["files_per_s"] > 0
    assert set(r["latency_ms"]) == {"p50", "p90", "p99", "max", "mean"}
    assert r["latency_ms"]["p50"] <= r["latency_ms"]["p99"] <= r["latency_ms"]["max"]
    assert len(r["runs"]) == 2 and r["cache"] == "warm"
    cp = r["baselines"]["cp"]
    assert cp["command"] == "cp -r"
    assert cp["ratio"] == pytest.approx(cp["seconds"] / r["seconds"])
    assert cp["files_per_s"] > 0 and cp["mb_per_s"] > 0
    if shutil.which("rsync"):
        assert r["baselines"]["rsync"]["ratio"] > 0
    assert list(src.iterdir()) == [] and list(dst.iterdir()) == []  # cleaned up


def test_single_file_uses_plain_cp_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = dirs(tmp_path)
    png = tmp_path / "t.png"
    code, out, err = run_cli(
        capsys,
        *("--source", str(src), "--destination", str(dst), "--total", "3M", "--files", "1"),
        *("--cache", "warm", "--json", "--plot", str(png)),
    )
    assert code == 0, err
    r = json.loads(out)
    assert r["files"] == 1 and r["total_bytes"] == 3 << 20
    assert r["baselines"]["cp"]["command"] == "cp"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r["samples"][-1][1] == 3 << 20


def test_keep_and_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, dst = dirs(tmp_path)
    code, out, err = run_cli(
        capsys,
        *("--source", str(src), "--destination", str(dst), "--files", "3", "--file-size", "1K"),
        *("--cache", "warm", "--no-baselines", "--keep"),
    )
    assert code == 0, err
    assert "files/s" in out and "latency" in out
    (kept,) = src.iterdir()
    assert len(list((kept / "data").rglob("f*"))) == 3


def test_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "--source", "rel", "--destination", str(tmp_path))
    assert code == 1 and "rel: give an absolute path" in err
    code, _, err = run_cli(
        capsys, "--source", str(tmp_path / "nope"), "--destination", str(tmp_path)
    )
    assert code == 1 and "nope: no such directory" in err
    code, _, err = run_cli(
        capsys,
        *("--source", str(tmp_path), "--destination", str(tmp_path)),
        *("--files", "2", "--file-size", "1K", "--total", "5K"),
    )
    assert code == 1 and "--total" in err


def test_plan_sizes() -> None:
    assert bench.plan_sizes(None, None, None) == bench.Plan(1000, 1 << 20)
    assert bench.plan_sizes(10, None, "1M") == bench.Plan(10, (1 << 20) // 10)
    assert bench.plan_sizes(None, "4K", "40K") == bench.Plan(10, 4096)
    assert bench.plan_sizes(None, None, "4G") == bench.Plan(1000, (4 << 30) // 1000)
    assert bench.plan_sizes(1, None, "4G") == bench.Plan(1, 4 << 30)


def test_percentiles() -> None:
    p = bench.percentiles([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert p is not None
    assert (p["p50"], p["p90"], p["p99"], p["max"]) == pytest.approx((50, 90, 99, 100))
    assert bench.percentiles([]) is None


def _user() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("bbuser1")
    except KeyError:
        return None


@pytest.mark.skipif(os.geteuid() != 0 or _user() is None, reason="needs root and bbuser1")
def test_as_user_writes_as_that_user(capsys: pytest.CaptureFixture[str]) -> None:
    user = _user()
    assert user is not None
    root = Path(tempfile.mkdtemp(prefix="bbstage-bench-test-", dir="/var/tmp"))
    try:
        root.chmod(0o755)
        src, dst = dirs(root)
        for d in (src, dst):
            os.chown(d, user.pw_uid, user.pw_gid)
        code, out, err = run_cli(
            capsys,
            *("--source", str(src), "--destination", str(dst), "--files", "5"),
            *("--file-size", "1K", "--as-user", "bbuser1", "--keep", "--json"),
        )
        assert code == 0, err
        assert json.loads(out)["cache"] == "warm"  # a user cannot drop caches
        kept = next(src.iterdir())
        assert kept.stat().st_uid == user.pw_uid
        code, _, err = run_cli(
            capsys, "--source", "/root", "--destination", str(dst), "--as-user", "bbuser1"
        )
        assert code == 1 and "/root" in err
    finally:
        shutil.rmtree(root)


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_s3_locations_against_rgw(
    s3: S3Env,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    direction: str,
) -> None:
    """`bbstage bench` through the S3 movers, with the caller's own credentials."""
    bucket = s3.create_bucket()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.admin.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.admin.secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    local, remote = tmp_path, f"s3://{bucket}/bench"
    src, dst = (local, remote) if direction == "upload" else (remote, local)
    code, out, err = run_cli(
        capsys,
        *("--source", str(src), "--destination", str(dst)),
        *("--files", "40", "--file-size", "16K", "--repeat", "2", "--json"),
    )
    assert code == 0, err
    r = json.loads(out)
    assert r["mover"] == ("s3:S3Upload" if direction == "upload" else "s3:S3Download")
    assert r["files"] == 40 and r["mb_per_s"] > 0 and r["files_per_s"] > 0
    assert r["baselines"] == {}
    assert list(local.iterdir()) == []  # cleaned up, both sides
    assert s3.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_run_order_balances_ours_and_cp() -> None:
    from bbstage.bench import run_order

    orders = [run_order(["bbstage", "cp", "rsync"], rep) for rep in range(4)]
    assert [o[0] for o in orders] == ["bbstage", "cp", "bbstage", "cp"]
    assert all(o[-1] == "rsync" for o in orders)
    assert run_order(["bbstage"], 1) == ["bbstage"]


def test_bench_modules_import_no_circle() -> None:
    """The modules of bbstage/bench/ import each other (at any depth, in functions too)
    without a circle: each can be read, and imported, after the ones it uses."""
    import ast

    package = Path(bench.__file__).parent
    uses: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        prefix = "bbstage.bench."
        uses[path.stem] = {n.removeprefix(prefix) for n in names if n.startswith(prefix)}
    done: set[str] = set()
    while len(done) < len(uses):
        ready = {m for m, deps in uses.items() if m not in done and deps <= done}
        assert ready, f"import circle among {sorted(set(uses) - done)}"
        done |= ready


def test_bench_spec_carries_no_account_table_as_the_engine_builds_it() -> None:
    """The bench's transfer spec is the engine's: ``[s3.accounts]`` (every user's keys)
    never crosses to a worker."""
    import dataclasses

    from bbstage.bench.transfer import make_spec
    from bbstage.config import Config

    s3 = {"endpoint_url": "http://127.0.0.1:1", "accounts": {"/etc/x": {}}}
    config = dataclasses.replace(Config(), backend_settings={"s3": s3})
    spec = make_spec("s3://b/k", "/tmp/k", "s3", "posix", config, tree=False, profile="site")
    # the typed [s3] (read once: its struct travels), without the account table
    assert spec.source_options.s3.endpoint_url == "http://127.0.0.1:1"
    assert spec.source_options.s3.accounts == {}
    assert spec.source_options.profile == "site"
    assert spec.destination_options is None  # the posix side carries nothing of S3
