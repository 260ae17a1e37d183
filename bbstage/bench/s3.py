"""Upload (local → s3://) or download (s3:// → local) through the S3 movers.

The data set is generated in the local directory; a download first uploads it, untimed.
The baselines are the S3 peers asked for (``--baselines s5cmd,rclone``, those installed), each
copying the same data in the same run, in its own prefix or directory, with the user's own
credentials; ours and the first peer swap places every other repetition (``run_order``).
Before every timed copy the local side is synced and (``cache="drop"``) its page cache dropped.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any

from bbstage import movers
from bbstage.bench.baselines import (
    S3_PEERS,
    run_order,
    run_peer,
    s3_peer_binary,
    s3_peer_command,
    s3_peer_env,
)
from bbstage.bench.cache import cache_policy, settle
from bbstage.bench.dataset import cleanup, generate, new_tag
from bbstage.bench.model import BenchError, Location, Options, Run
from bbstage.bench.progress import progress_bar
from bbstage.bench.results import result, summary
from bbstage.bench.transfer import make_spec, run_transfer
from bbstage.movers import MoverOptions
from bbstage.transfer import TransferSpec


def bench_s3(opts: Options, src: Location, dst: Location) -> dict[str, Any]:
    """Generate, upload or download ``opts.repeat`` times, clean up both sides."""
    if src.kind == dst.kind:
        raise BenchError("one location must be a local directory and the other s3://bucket/prefix")
    local, remote = (src, dst) if src.kind == "posix" else (dst, src)
    if not os.path.isabs(local.text) or not os.path.isdir(local.text):
        raise BenchError(f"{local.text}: give an existing local directory")
    unknown = [p for p in opts.peers if p not in S3_PEERS]
    if unknown:
        raise BenchError(f"--baselines {','.join(unknown)}: S3 baselines are {','.join(S3_PEERS)}")
    peers = [p for p in opts.peers if s3_peer_binary(p)] if opts.baselines else []
    cache = cache_policy(opts.cache)
    tag = new_tag()
    local_root, remote_root = local.join(tag), remote.join(tag)
    plan, upload = opts.plan, src.kind == "posix"
    from bbstage.movers.implementations import s3

    endpoint = os.environ.get("AWS_ENDPOINT_URL")  # the admin's own, for this run
    s3conf = s3.S3Settings.from_config(opts.config.backend_settings.get("s3", {}))
    if endpoint:
        s3conf = s3.allow_endpoint(s3conf, endpoint)
        settings = {**opts.config.backend_settings, "s3": s3conf}
        opts = dataclasses.replace(
            opts, config=dataclasses.replace(opts.config, backend_settings=settings)
        )
    profile = {"profile": opts.profile} if opts.profile else {}
    s3_mover = movers.get("posix", "s3")(
        MoverOptions(destination=movers.options_for("s3", {"s3": s3conf}, os.getuid(), profile))
    )
    env = s3_peer_env(*s3.user_client(opts.profile, s3conf)) if peers else {}
    runs: dict[str, list[Run]] = {name: [] for name in ["bbstage", *peers]}
    try:
        with cleanup([local_root], opts.keep), progress_bar(opts.progress, plan) as bar:
            bar.phase("generating")
            data = generate(os.path.join(local_root, "src"), plan)
            tree = data.endswith("/")
            name = "data/" if tree else "data.bin"
            remote_data = f"{remote_root}/{name}"

            def spec(a: str, b: str) -> TransferSpec:
                kinds = ("posix", "s3") if a == data else ("s3", "posix")
                return make_spec(a, b, *kinds, opts.config, tree=tree, checksum=opts.checksum,
                                 profile=opts.profile)  # fmt: skip

            def target(who: str) -> str:
                """Where ``who`` writes: its own prefix (uploads) or directory (downloads)."""
                if upload:
                    return remote_data if who == "bbstage" else f"{remote_root}/{who}/{name}"
                return os.path.join(local_root, f"dst-{who}", name)

            if not upload:
                bar.phase("uploading the data set")
                run_transfer(spec(data, remote_data), plan, None)
            for rep in range(opts.repeat):
                for who in run_order(list(runs), rep):
                    dst = target(who)
                    if upload:
                        s3_mover.remove(dst)
                    else:
                        shutil.rmtree(os.path.dirname(dst), ignore_errors=True)
                    settle(cache)
                    bar.phase(f"{who} ({rep + 1}/{opts.repeat})")
                    source = data if upload else remote_data
                    if who == "bbstage":
                        runs[who].append(
                            run_transfer(spec(source, dst), plan, bar.update, opts.runner)
                        )
                    else:
                        if not upload:
                            os.makedirs(os.path.dirname(dst), exist_ok=True)
                        argv = s3_peer_command(who, source, dst, tree)
                        runs[who].append(run_peer(argv, env, plan))
    finally:
        if not opts.keep:
            s3_mover.remove(remote_root)
        s3_mover.close()
    pair = ("posix", "s3") if upload else ("s3", "posix")
    name = f"s3:{movers.get(*pair).__name__}"  # as the results name it ("s3:S3Upload")
    out = result(opts, name, runs["bbstage"], cache=cache, settings={})
    for who in peers:
        base = summary(runs[who])
        base["command"] = who
        base["ratio"] = base["seconds"] / out["seconds"] if out["seconds"] > 0 else None
        out["baselines"][who] = base
    return out
