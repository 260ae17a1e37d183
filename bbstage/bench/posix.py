"""POSIX to POSIX: ours against ``cp`` (``cp -r`` for a tree) and ``rsync -a`` (when
installed), each copying the same data in the same run to a fresh destination.

Fairness: before every timed copy the previous destination is removed and ``sync`` runs;
with ``cache="drop"`` (the default when permitted: root and a writable
``/proc/sys/vm/drop_caches``) the page cache is dropped too, so every copy reads cold data;
otherwise every copy reads the source from a warm cache (it was just written). Nobody
fsyncs. Ours and cp swap places every other repetition; the report gives medians.
"""

from __future__ import annotations

import os
from typing import Any

from bbstage import movers
from bbstage.bench.baselines import baseline_commands, command_label, run_command, run_order
from bbstage.bench.cache import cache_policy, settle
from bbstage.bench.dataset import cleanup, clear, generate, new_tag
from bbstage.bench.model import BenchError, Location, Options, Run
from bbstage.bench.progress import progress_bar
from bbstage.bench.results import result, summary
from bbstage.bench.transfer import make_spec, run_transfer


def bench_posix(opts: Options, src_loc: Location, dst_loc: Location) -> dict[str, Any]:
    """Generate, stage and time the baselines, clean up; return the result dict."""
    for loc in (src_loc, dst_loc):
        if not os.path.isabs(loc.text):
            raise BenchError(f"{loc.text}: give an absolute path (or s3://bucket/prefix)")
        if not os.path.isdir(loc.text):
            raise BenchError(f"{loc.text}: no such directory (create it first)")
    cache = cache_policy(opts.cache)
    tag = new_tag()
    src_root, work = src_loc.join(tag), dst_loc.join(tag)
    plan = opts.plan
    with cleanup([src_root, work], opts.keep), progress_bar(opts.progress, plan) as bar:
        bar.phase("generating")
        source = generate(src_root, plan)
        os.makedirs(work, exist_ok=True)
        tree = source.endswith("/")
        ours_dst = os.path.join(work, "bbstage") + ("/" if tree else "")
        spec = make_spec(
            source,
            ours_dst,
            "posix",
            "posix",
            opts.config,
            tree=tree,
            checksum=opts.checksum,
            profile=opts.profile,
        )
        commands = baseline_commands(source, work, tree) if opts.baselines else {}
        contenders = ["bbstage", *commands]
        runs: dict[str, list[Run]] = {name: [] for name in contenders}
        if commands and opts.repeat > 1:
            # The first copy after the data was written runs slow for whoever makes it
            # (docs/performance.md has the numbers): one untimed copy for nobody.
            bar.phase("warm-up (untimed)")
            clear(work)
            settle(cache)
            run_command(next(iter(commands.values()))(), plan)
        for rep in range(opts.repeat):
            for name in run_order(contenders, rep):
                clear(work)
                settle(cache)
                bar.phase(f"{name} ({rep + 1}/{opts.repeat})")
                if name == "bbstage":
                    runs[name].append(run_transfer(spec, plan, bar.update, opts.runner))
                else:
                    runs[name].append(run_command(commands[name](), plan))
            clear(work)
    settings = {"threads": opts.config.threads_per_transfer, "chunk_size": opts.config.chunk_size}
    out = result(
        opts,
        f"posix:{movers.get('posix', 'posix').__name__}",
        runs["bbstage"],
        cache=cache,
        settings=settings,
    )
    for name in commands:
        base = summary(runs[name])
        base["command"] = command_label(name, tree)
        base["ratio"] = base["seconds"] / out["seconds"] if out["seconds"] > 0 else None
        out["baselines"][name] = base
    return out
