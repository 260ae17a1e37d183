"""The `bbstage` command: status for users; daemon, validation, install and admin views."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The client's commands read the config by clientconfig alone: a job step's Python may have
# the client's libraries only (no msgspec). bbstage.config is imported where it is needed.
from bbstage import __version__, clientconfig, where

if TYPE_CHECKING:
    from bbstage import config

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_UNREACHABLE = 0, 1, 2, 3, 4


def _config(args: argparse.Namespace) -> config.Config:
    from bbstage import config

    try:
        return config.load(args.config)
    except config.ConfigError as exc:
        sys.exit(f"bbstage: {exc}")


class _Version(argparse.Action):
    """``--version``: one line, never wrapped (argparse's own wraps a long path)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"bbstage {__version__} from {where()}")
        parser.exit()


def cmd_daemon(args: argparse.Namespace) -> int:
    from bbstage.daemon import service as daemon

    return daemon.run(_config(args))


def cmd_validate(args: argparse.Namespace) -> int:
    from bbstage import config
    from bbstage.cli import validate

    try:  # the site's backends and their URL rules ([backends] enabled, allowed_hosts)
        registry = config.load(args.config).registry
    except (config.ConfigError, OSError) as exc:
        from bbstage import movers

        registry = movers.Registry.default()  # not half of the file's
        print(
            f"bbstage validate: warning: {exc}: URLs are checked by the default rules"
            " (those of a site without [backends])",
            file=sys.stderr,
        )
    return validate.run(args.script, args.json, registry)


def cmd_drain(args: argparse.Namespace) -> int:
    import time

    from bbstage.client import DaemonError, Unreachable, call

    result = _ask(args, "drain", deadline=args.deadline)
    print(f"draining: {result['running']} transfers running, {result['queued']} queued (they"
          f" wait for the next start); the daemon stops when the running ones end, or in"
          f" {args.deadline:g} s")  # fmt: skip
    if args.no_wait:
        return EXIT_OK
    socket = clientconfig.load_client(args.config).user_socket
    until = time.monotonic() + args.deadline + 60
    while time.monotonic() < until:
        try:
            call(socket, "ping", timeout=2)
        except Unreachable:
            print("the daemon has stopped: upgrade it now, then start it")
            return EXIT_OK
        except DaemonError:
            pass
        time.sleep(0.5)
    print(
        f"bbstage drain: the daemon still answers {args.deadline + 60:g} s later", file=sys.stderr
    )
    return EXIT_FAILED


def cmd_state(args: argparse.Namespace) -> int:
    from bbstage.daemon import backup, schema

    state_dir = _config(args).state_dir
    try:
        if args.action == "backup":
            print(f"backed up {backup.database(state_dir)} to {args.file}:"
                  f" {backup.backup(state_dir, Path(args.file))}")  # fmt: skip
        elif args.action == "restore":
            what, aside = backup.restore(state_dir, Path(args.file))
            print(f"restored {args.file} ({what}) as {backup.database(state_dir)}"
                  + (f"; the database it replaced is {aside}" if aside else ""))  # fmt: skip
        else:
            print(f"{backup.database(state_dir)}: {backup.describe(backup.database(state_dir))};"
                  f" this bbstage knows schema versions up to {schema.LATEST}")  # fmt: skip
    except backup.BackupError as exc:
        print(f"bbstage state {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_install_lua(args: argparse.Namespace) -> int:
    from bbstage.cli import luainstall

    try:
        target = luainstall.target(args.lua, args.slurm_plugin and Path(args.slurm_plugin))
    except ValueError as exc:
        sys.exit(f"bbstage install-lua: {exc}")
    for path in luainstall.install(_config(args), Path(args.dest), str(args.config), target):
        print(f"installed {path}", file=sys.stderr)
    if target.luac is None:
        print(f"bbstage install-lua: Lua sources only, not precompiled (every sbatch pays for"
              f" compiling them): {target.why}", file=sys.stderr)  # fmt: skip
    else:
        print(f"bbstage install-lua: precompiled for {target.why}", file=sys.stderr)
    return EXIT_OK


def _ask(args: argparse.Namespace, op: str, **fields: Any) -> Any:
    """One request, to the user socket where this host has it, else the network API."""
    from bbstage.client import DaemonError, Unreachable, call, target

    try:
        conf = clientconfig.load_client(args.config)
    except clientconfig.ConfigError as exc:
        sys.exit(f"bbstage: {exc}")
    try:
        return call(target(conf.user_socket, conf.api_address, conf.munge_socket), op, **fields)
    except DaemonError as exc:
        print(f"bbstage: {exc}", file=sys.stderr)
        sys.exit(EXIT_UNREACHABLE if isinstance(exc, Unreachable) else EXIT_NOT_FOUND)


def _job_client(args: argparse.Namespace) -> Any:
    from bbstage import api

    try:
        client = api.Client(args.config, args.job)
        client.job_id  # noqa: B018  (refuses now when there is no job)
    except (ValueError, clientconfig.ConfigError) as exc:
        sys.exit(f"bbstage: {exc}")
    return client


def cmd_copy(args: argparse.Namespace) -> int:
    from bbstage import api
    from bbstage.client import DaemonError, Unreachable

    client = _job_client(args)
    try:
        copy_id = client.copy(args.source, args.destination, checksum=args.checksum,
                              overwrite=args.overwrite, profile=args.profile,
                              at_end=args.at_end)  # fmt: skip
        rows = client.wait([copy_id]) if args.wait and not args.at_end else None
    except api.CopyFailed as exc:
        print(f"bbstage: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except DaemonError as exc:
        print(f"bbstage: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE if isinstance(exc, Unreachable) else EXIT_FAILED
    if args.json:
        print(json.dumps({"id": copy_id, "at_end": args.at_end, "copies": rows}))
    else:
        print(copy_id)
    return EXIT_OK


def cmd_wait(args: argparse.Namespace) -> int:
    from bbstage import api
    from bbstage.client import DaemonError, Unreachable

    client = _job_client(args)
    try:
        rows = client.wait(args.ids or None, args.timeout)
    except api.CopyFailed as exc:
        for copy_id, why in exc.failures:
            print(f"bbstage: copy {copy_id} failed: {why}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, TimeoutError) as exc:
        print(f"bbstage: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except DaemonError as exc:
        print(f"bbstage: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE if isinstance(exc, Unreachable) else EXIT_FAILED
    for row in rows:
        print(f"{row['id']} done: {row['bytes_done']} bytes, {row['files_done']} files")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    from bbstage.client import DaemonError

    if ":" in args.id:
        args.job = args.id.partition(":")[0]
    client = _job_client(args)
    try:
        state = client.cancel(args.id)
    except (ValueError, DaemonError) as exc:
        print(f"bbstage: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.id} {state}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from bbstage.cli import render

    if not args.job_id.isdigit():
        print(f"bbstage: job id must be a number, got {args.job_id!r}", file=sys.stderr)
        return EXIT_USAGE
    status = _ask(args, "status", job_id=args.job_id)
    if args.watch:
        status = render.watch(lambda: _ask(args, "status", job_id=args.job_id), args.interval)
    elif args.json:
        print(json.dumps(status, indent=2))
    else:
        render.status(status)
    return EXIT_FAILED if status["state"] == "failed" else EXIT_OK


def cmd_jobs(args: argparse.Namespace) -> int:
    from bbstage.cli import render

    jobs = _ask(args, "jobs")
    print(json.dumps(jobs, indent=2)) if args.json else render.jobs(jobs)
    return EXIT_OK


def cmd_pools(args: argparse.Namespace) -> int:
    from bbstage.cli import render

    pools = _ask(args, "pools")
    print(json.dumps(pools, indent=2)) if args.json else render.pools(pools)
    return EXIT_OK


def cmd_config_check(args: argparse.Namespace) -> int:
    from bbstage.cli import checks

    return checks.run(_config(args), args.slurm_conf_dir)


def cmd_health(args: argparse.Namespace) -> int:
    from bbstage.cli import health

    return health.main(args.config, args.timeout)


def cmd_bench(args: argparse.Namespace) -> int:
    from bbstage import bench

    return bench.main(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bbstage",
        description="Data staging for Slurm burst_buffer/lua (#BB_LUA stage_in/stage_out).",
        epilog="Exit codes: 0 ok, 1 staging failed or script invalid, 2 usage error, "
        "3 no such job of yours, 4 daemon not reachable.",
    )
    p.add_argument(
        "--version", action=_Version, nargs=0, help="show the version and where it runs from"
    )
    p.add_argument(
        "--config",
        default=os.environ.get("BBSTAGE_CONFIG", str(clientconfig.DEFAULT_PATH)),
        help="daemon config file (default: $BBSTAGE_CONFIG or %(default)s)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("status", help="show a job's staging: state and one row per directive")
    s.add_argument("job_id", help="Slurm job id")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument(
        "--watch", action="store_true", help="live progress bars until staging has finished"
    )
    s.add_argument("--interval", type=float, default=1.0, help="--watch refresh, seconds")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("validate", help="check the #BB_LUA directives of a batch script")
    s.add_argument("script", help="batch script to check")
    s.add_argument("--json", action="store_true", help="print the parse result as JSON")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("jobs", help="staging jobs you may see (all of them for admins)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_jobs)

    s = sub.add_parser("pools", help="scratch pools: capacity, reserved, free")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_pools)

    job = os.environ.get("SLURM_JOB_ID")
    s = sub.add_parser(
        "copy",
        help="during a job: copy now (or --at-end) as the job's user; prints the copy's id",
        description="From inside a running job: copy SOURCE to DESTINATION now, in the"
        " background, with a stage_out directive's rules (absolute paths, $BB_SCRATCH,"
        " s3://; use single quotes for $BB_SCRATCH so the daemon resolves it).",
    )
    s.add_argument("source")
    s.add_argument("destination")
    s.add_argument("--checksum", choices=("none", "xxh3", "blake2b"))
    s.add_argument("--overwrite", choices=("always", "never", "newer"))
    s.add_argument("--profile", help="S3 profile from your ~/.aws files")
    s.add_argument(
        "--at-end", action="store_true", help="stage out after the job ends, with its stage-outs"
    )
    s.add_argument("--wait", action="store_true", help="return when the copy has ended")
    s.add_argument("--json", action="store_true")
    s.add_argument("--job", default=job, help="job id (default: $SLURM_JOB_ID)")
    s.set_defaults(func=cmd_copy)

    s = sub.add_parser("wait", help="during a job: wait for its copies (all, or the IDs)")
    s.add_argument("ids", nargs="*", metavar="ID", help="copy ids (JOBID:N) from bbstage copy")
    s.add_argument("--timeout", type=float, help="give up after this many seconds")
    s.add_argument("--job", default=job, help="job id (default: $SLURM_JOB_ID)")
    s.set_defaults(func=cmd_wait)

    s = sub.add_parser("cancel", help="stop an in-job copy (ID from bbstage copy)")
    s.add_argument("id", metavar="ID")
    s.add_argument("--job", default=job, help="job id (default: $SLURM_JOB_ID)")
    s.set_defaults(func=cmd_cancel)

    s = sub.add_parser("daemon", help="run the staging daemon in the foreground (as root)")
    s.set_defaults(func=cmd_daemon)

    s = sub.add_parser("config", help="check the daemon's configuration (admins)")
    csub = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = csub.add_parser("check", help="check config, pools, sockets, Slurm and Lua install")
    c.add_argument(
        "--slurm-conf-dir", help="directory of slurm.conf: also check the installed hooks"
    )
    c.set_defaults(func=cmd_config_check)

    s = sub.add_parser(
        "drain",
        help="before an upgrade: start nothing new, stop when running transfers end (root)",
        description="Stop the daemon for an upgrade without failing a job: new work is"
        " answered 'ask again' (the hooks and clients do, until the next daemon answers),"
        " running transfers go on until they end or --deadline passes, then the daemon"
        " stops as on SIGTERM (what still ran resumes at the next start). Waits until it"
        " has stopped.",
    )
    s.add_argument("--deadline", type=float, default=60.0,
                   help="seconds running transfers may take (default 60; keep it well under"
                   " Slurm's OtherTimeout)")  # fmt: skip
    s.add_argument("--no-wait", action="store_true", help="return at once")
    s.set_defaults(func=cmd_drain)

    s = sub.add_parser("state", help="the state database: version, backup, restore (admins)")
    csub = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = csub.add_parser("version", help="its schema version and the newest this bbstage knows")
    c.set_defaults(func=cmd_state)
    c = csub.add_parser("backup", help="an online copy of it to FILE (the daemon may run)")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=cmd_state)
    c = csub.add_parser("restore", help="put a backup back (the daemon stopped)")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=cmd_state)

    s = sub.add_parser(
        "health",
        help="check daemon, state, pools and munge for monitoring (admins, as root)",
        description="One line for a monitoring system (Nagios plugin format), then a line per"
        " check. Exit code 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN. Each check runs in a"
        " process of its own and is CRITICAL if it has not answered within --timeout.",
    )
    s.add_argument(
        "--timeout", type=float, default=10.0, help="seconds for each check (default 10)"
    )
    s.set_defaults(func=cmd_health)

    s = sub.add_parser(
        "install-lua", help="install burst_buffer.lua and its site file beside slurm.conf"
    )
    s.add_argument("--dest", required=True, help="directory that holds slurm.conf")
    s.add_argument(
        "--slurm-plugin",
        metavar="PATH",
        help="Slurm's burst_buffer_lua.so, to read which Lua it links (default: look in the"
        " usual PluginDirs, e.g. /usr/lib/x86_64-linux-gnu/slurm-wlm, /usr/lib64/slurm)",
    )
    s.add_argument(
        "--lua",
        choices=("5.1", "5.2", "5.3", "5.4"),
        help="precompile for this Lua version instead of the one read from the plugin",
    )
    s.set_defaults(func=cmd_install_lua)

    s = sub.add_parser(
        "bench",
        help="time staging a generated data set (vs cp -r and rsync -a for POSIX)",
        description="Generate a data set under --source, stage it to --destination through "
        "the movers real jobs use, report MB/s, files/s and per-file latency; for POSIX "
        "locations also time cp and rsync -a on the same data. One side may be "
        "s3://bucket/prefix (with your own credentials); the data set is then made locally "
        "(and uploaded first, untimed, to measure downloads). Removes what it generated.",
    )
    s.add_argument("--source", required=True, help="directory (or s3://bucket/prefix)")
    s.add_argument("--destination", required=True, help="directory (or s3://bucket/prefix)")
    s.add_argument("--files", type=int, help="number of files (default 1000)")
    s.add_argument("--file-size", help="size of each file, e.g. 4K, 1M (default 1M)")
    s.add_argument("--total", help="total size, e.g. 4G (with --files or --file-size)")
    s.add_argument("--repeat", type=int, default=1, help="timed runs each; medians (default 1)")
    s.add_argument("--threads", type=int, help="threads per transfer (default: from config)")
    s.add_argument("--checksum", default="none", choices=["none", "xxh3", "blake2b"])
    s.add_argument(
        "--cache",
        default="auto",
        choices=["auto", "drop", "warm"],
        help="drop the page cache before each copy (auto: when permitted) or keep it warm",
    )
    s.add_argument("--no-baselines", action="store_true", help="do not time cp / rsync")
    s.add_argument(
        "--baselines",
        default="",
        metavar="NAMES",
        help="with an s3:// side: also time these peers where installed (s5cmd,rclone)",
    )
    s.add_argument("--as-user", metavar="USER", help="(root) run everything as USER")
    s.add_argument(
        "--executor",
        "--engine",  # its old name
        dest="executor",
        default="local",
        choices=["local", "dask"],
        help="dask: our copy runs on the [movers] Dask cluster's nodes as --as-user USER",
    )
    s.add_argument("--keep", action="store_true", help="keep the generated data")
    s.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    s.add_argument("--plot", metavar="FILE.png", help="throughput over time (matplotlib)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
