"""Upload (local → s3://) or download (s3:// → local) through the S3 movers.

The data set is generated in the local directory; a download first uploads it, untimed.
No cp/rsync baseline applies (benchmarks/bench_s3.py compares with boto3's).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from bbstage import movers
from bbstage.bench.dataset import cleanup, generate, new_tag
from bbstage.bench.model import BenchError, Location, Options, Run
from bbstage.bench.progress import progress_bar
from bbstage.bench.results import result
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
    tag = new_tag()
    local_root, remote_root = local.join(tag), remote.join(tag)
    plan, upload = opts.plan, src.kind == "posix"
    s3_mover = movers.get("posix", "s3")(
        MoverOptions(extra={"s3": opts.config.s3, "profile": opts.profile})
    )
    runs: list[Run] = []
    try:
        with cleanup([local_root], opts.keep), progress_bar(opts.progress, plan) as bar:
            bar.phase("generating")
            data = generate(os.path.join(local_root, "src"), plan)
            tree = data.endswith("/")
            name = "data/" if tree else "data.bin"
            remote_data = f"{remote_root}/{name}"
            local_dst = os.path.join(local_root, "dst", name)

            def spec(a: str, b: str) -> TransferSpec:
                kinds = ("posix", "s3") if a == data else ("s3", "posix")
                return make_spec(a, b, *kinds, opts.config, tree=tree, checksum=opts.checksum,
                                 profile=opts.profile)  # fmt: skip

            if not upload:
                bar.phase("uploading the data set")
                run_transfer(spec(data, remote_data), plan, None)
            for rep in range(opts.repeat):
                if upload:
                    s3_mover.remove(remote_data)
                else:
                    shutil.rmtree(os.path.join(local_root, "dst"), ignore_errors=True)
                bar.phase(f"bbstage ({rep + 1}/{opts.repeat})")
                transfer = spec(data, remote_data) if upload else spec(remote_data, local_dst)
                runs.append(run_transfer(transfer, plan, bar.update))
    finally:
        if not opts.keep:
            s3_mover.remove(remote_root)
        s3_mover.close()
    pair = ("posix", "s3") if upload else ("s3", "posix")
    return result(opts, movers.registry[pair], runs, cache="n/a", settings={})
