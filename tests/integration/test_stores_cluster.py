"""Real ``sbatch`` jobs staging from and to each generic backend's local server
(scripts/local-stores: gcp-storage-emulator, Azurite, OpenSSH, HTTPS with a test CA), as
bbuser1 with bbuser1's own credentials in their home; bytes checked.

The cluster's daemon config gets ``[backends] enabled``, ``[gs]`` and ``[https]`` from
scripts/local-cluster when scripts/local-stores was set up before it (``stores_config``), and
``bbstage install-lua`` writes the schemes into ``bbstage_site.lua``: the stores fixture runs
first, then the cluster's ``up``."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from bbstage.movers.implementations.fsstore import StoreOptions
from tests.backends.stores import open_store, stores_env, user_home
from tests.helpers import digest

from .conftest import USER, Cluster, as_user

__all__ = ["stores_env"]

KINDS = ["gs", "az", "sftp", "https"]


@pytest.fixture
def store(
    request: pytest.FixtureRequest,
    stores_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):  # type: ignore[no-untyped-def]  # noqa: ANN201
    kind = request.param
    user_home(tmp_path, monkeypatch, USER)  # this process puts and reads as the user would
    options = {
        "gs": StoreOptions(
            {"endpoint_url": stores_env["BBSTAGE_GS_ENDPOINT"], "anonymous": "true"}
        ),
        "https": StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]}),
    }.get(kind, StoreOptions({}))
    yield from open_store(kind, stores_env, options)


def random_body(n: int) -> bytes:
    """Random bytes that never end in a carriage return: gcp-storage-emulator's multipart
    parser drops a body's trailing one (1 random body in 256; GCS keeps it)."""
    data = os.urandom(n)
    return data[:-1] + b"\n" if data.endswith(b"\r") else data


@pytest.mark.cluster
@pytest.mark.parametrize("store", KINDS, indirect=True)
def test_stage_in_from_each_store_and_out_to_it(store, cluster: Cluster, workdir: Path) -> None:  # type: ignore[no-untyped-def]
    """A file and a tree staged in from the store into $BB_SCRATCH, the job copies them to
    its directory; its result staged out to the store (not for https://, a source only)."""
    as_user(workdir)
    one = random_body(3 << 20)
    tree = {"t/a": random_body(1000), "t/sub/b": random_body(70_000)}
    store.put("one.dat", one)
    for name, body in tree.items():
        store.put(name, body)
    out = workdir / "out"
    out.mkdir()
    as_user(out)
    stage_out = (
        ""
        if store.read_only
        else f"#BB_LUA stage_out source={out}/result.dat destination={store.url('result.dat')}\n"
    )
    # result.dat never ends in b"\r": gcp-storage-emulator's multipart parser drops a body's
    # trailing b"\r" (1 random body in 256: a CI run, 22.05-gs); GCS keeps it
    jid = cluster.submit(
        workdir,
        f"""#!/bin/bash
#BB_LUA stage_in source={store.url("one.dat")} destination=$BB_SCRATCH/one.dat
#BB_LUA stage_in source={store.url("t/")} destination=$BB_SCRATCH/t/
{stage_out}cp "$BB_SCRATCH/one.dat" {out}/one.dat
cp -r "$BB_SCRATCH/t" {out}/t
{{ head -c 199999 /dev/urandom; printf x; }} > {out}/result.dat
""",
    )
    cluster.wait_gone(jid, timeout=300)
    assert cluster.job(jid)["JobState"] == "COMPLETED", cluster.status(jid)
    assert all(d["state"] == "done" for d in cluster.status(jid)["directives"])
    assert digest((out / "one.dat").read_bytes()) == digest(one)
    for name, body in tree.items():
        assert digest((out / name).read_bytes()) == digest(body)
    if not store.read_only:
        assert digest(store.get("result.dat") or b"") == digest((out / "result.dat").read_bytes())
    assert pwd.getpwuid((out / "one.dat").stat().st_uid).pw_name == USER
