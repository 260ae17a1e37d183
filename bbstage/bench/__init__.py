"""``bbstage bench``: stage a generated data set through the movers real jobs use, and time it.

The transfer runs through :func:`bbstage.transfer.worker.run` with a spec built like
``Engine._spec`` builds one, in this process — or, with ``as_user``, in a child process
that has dropped to that user first, as the daemon's workers do. Where both locations are
POSIX, ``cp`` and ``rsync -a`` copy the same data in the same run (:mod:`.posix` says how
the comparison is kept fair); with an ``s3://`` location the S3 movers run alone
(:mod:`.s3`).

Modules: ``model`` (plan, options, a timed run), ``dataset`` (generated data, scratch
directories), ``transfer`` (ours), ``baselines`` (cp, rsync, run order), ``cache``
(page cache, idle disks), ``posix`` / ``s3`` (the two benchmarks), ``run`` (here or as
another user), ``results`` (the JSON), ``progress`` and ``output`` (what a person sees).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from bbstage import log, movers
from bbstage.bench.baselines import run_order
from bbstage.bench.model import BenchError, Options, Plan, plan_sizes
from bbstage.bench.output import human, plot, render, require_matplotlib
from bbstage.bench.results import environment, percentiles
from bbstage.bench.run import bench, bench_as, bench_dask
from bbstage.config import ConfigError, load

__all__ = [
    "BenchError",
    "Options",
    "Plan",
    "bench",
    "bench_as",
    "bench_dask",
    "environment",
    "human",
    "main",
    "percentiles",
    "plan_sizes",
    "plot",
    "run_order",
]


def main(args: argparse.Namespace) -> int:
    """``bbstage bench`` (``args`` from the CLI parser)."""
    try:
        cfg = load(args.config)
    except ConfigError as exc:
        print(f"bbstage: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        cfg = dataclasses.replace(cfg, threads_per_transfer=args.threads)
    try:
        if args.plot:
            require_matplotlib()
        opts = Options(
            source=args.source,
            destination=args.destination,
            plan=plan_sizes(args.files, args.file_size, args.total),
            repeat=max(1, args.repeat),
            baselines=not args.no_baselines,
            peers=tuple(name for name in args.baselines.split(",") if name),
            cache=args.cache,
            keep=args.keep,
            checksum=args.checksum,
            config=cfg,
            progress=sys.stderr.isatty() and not args.quiet,
        )
        result: dict[str, Any]
        with log.quiet():  # stdout is the result's
            if args.executor == "dask":
                result = bench_dask(opts, args.as_user)
            else:
                result = bench_as(opts, args.as_user) if args.as_user else bench(opts)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            render(result)
        if args.plot:
            plot(result, args.plot)
    except (BenchError, movers.TransferError, ValueError) as exc:
        print(f"bbstage bench: {exc}", file=sys.stderr)
        return 1
    return 0
