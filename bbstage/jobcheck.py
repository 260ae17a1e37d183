"""Is job J running in Slurm, and owned by uid U? Asked before an in-job copy starts
(``[daemon] job_check = "slurm"``), as the reconciler asks: one ``squeue`` for one job id.

A request that came over the network API also names its origin (the TCP peer's address):
it must be one of the job's nodes (their ``NodeAddr``, from ``scontrol show node``), so root
on a compromised node, who can mint a munge credential for any uid, can act only for the
jobs running on that node (docs/security.md "network API")."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import socket

SQUEUE_TIMEOUT = 30.0  # seconds; the copy is refused if squeue does not answer by then


async def running_as(
    job_id: str, uid: int, slurm_conf: str | None, origin: str | None = None
) -> str | None:
    """None if Slurm runs ``job_id`` (digits only) for ``uid`` (and, when ``origin`` is given,
    on a node with that address); otherwise why not."""
    if not job_id.isdigit():
        return f"job id must be a number, got {job_id!r}"
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    # %A: the job's own id (also for an array task), %T: its state, %U: its owner's uid,
    # %N: its nodes (a hostlist such as node[1-4]).
    out, why = await _run(env, "squeue", "-h", "-j", job_id, "-o", "%A %T %U %N")
    if out is None:
        return why if "Invalid job id" not in why else f"Slurm does not know job {job_id}"
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0] == job_id:
            if fields[2] != str(uid):
                return f"job {job_id} is not yours"
            if fields[1] != "RUNNING":
                return f"job {job_id} is not running ({fields[1]})"
            if origin is None:
                return None
            nodes = fields[3] if len(fields) > 3 else ""
            return await _from_nodes(env, job_id, nodes, origin)
    return f"Slurm does not know job {job_id}"


async def _from_nodes(env: dict[str, str], job_id: str, nodes: str, origin: str) -> str | None:
    """None if ``origin`` is an address of one of ``nodes`` (the job's hostlist)."""
    refused = f"the request came from {origin}, which is not one of job {job_id}'s nodes"
    if not nodes:
        return refused
    out, why = await _run(env, "scontrol", "-o", "show", "node", nodes)
    if out is None:
        return why
    addresses = [
        field.partition("=")[2]
        for line in out.splitlines()
        for field in line.split()
        if field.startswith("NodeAddr=")
    ]
    peer = _address(origin)
    loop = asyncio.get_running_loop()
    for name in addresses:
        try:
            infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            continue
        if any(_address(str(info[4][0])) == peer for info in infos):
            return None
    return f"{refused} ({nodes})"


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | str:
    """An address to compare: IPv4-mapped IPv6 (``::ffff:10.0.0.1``) as IPv4."""
    try:
        addr = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return text
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


async def _run(env: dict[str, str], *argv: str) -> tuple[str | None, str]:
    """(stdout, "") of a Slurm command, or (None, why it gave none)."""
    path = shutil.which(argv[0])
    if path is None:
        return (
            None,
            f"{argv[0]} is not installed on the staging daemon's host: cannot check the job",
        )
    proc = await asyncio.create_subprocess_exec(
        path, *argv[1:], env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), SQUEUE_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None, f"Slurm did not answer in {SQUEUE_TIMEOUT:g} s; try again"
    if proc.returncode:
        text = err.decode(errors="replace").strip()[:200]
        return None, text if "Invalid job id" in text else f"{argv[0]} failed: {text}"
    return out.decode(errors="replace"), ""
