"""The daemon's sockets: a ZeroMQ ROUTER for the Slurm hooks, a Unix socket for users, and
(``api_address``) the munge-authenticated network API (``netapi.py``). Users' requests from
either transport are answered by one handler, ``Server.respond``."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import socket
import struct
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog
import zmq
import zmq.asyncio

from bbstage import protocol
from bbstage.daemon import drain, jobcheck, report, staged
from bbstage.daemon.engine import Engine, internal_error
from bbstage.daemon.lifecycle import Refused
from bbstage.protocol import AGAIN, ERROR, MAX_USER_REQUEST, OK, ProtocolError, Reply

log = structlog.get_logger("bbstage.daemon.server")
# User socket (docs/protocol.md): connections open at once, in all and per uid. Past either,
# a connection is answered "busy" at once and closed: an idle client holds at most its own
# uid's share, so one user cannot make `bbstage status` of another wait or fail.
USER_CONNECTIONS = 256
USER_CONNECTIONS_PER_UID = 8
USER_READ_TIMEOUT = 2.0  # seconds for the request line: the CLI sends it right after connecting
USER_WRITE_TIMEOUT = 5.0  # seconds for the reply to be taken


def not_yours(job_id: str) -> str:
    """The one answer for a job bbstage does not know and for another user's job, so that it
    tells no one whose job an id is; it says what makes a job a staging job."""
    return (
        f"job {job_id}: no staging job of yours with this id. bbstage knows a job only if its"
        " batch script has a #BB_LUA line before the first command (for an in-job copy with"
        " no staging, '#BB_LUA pool=NAME capacity=SIZE' for a scratch area; `bbstage pools`"
        " lists them) and you submitted it"
    )


class Server:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.config = engine.config
        self._ctx = zmq.asyncio.Context()
        self._router: zmq.asyncio.Socket | None = None
        self._users: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._open: Counter[int] = Counter()  # user requests being served, by uid (both
        # transports: a user's API requests and socket connections share one allowance)
        self._api: Any = None  # netapi.Api when api_address is set
        self.stop: Any = None  # what stops the daemon as SIGTERM does (set by service.py)
        self.draining = False  # bbstage drain: new work is answered "again"

    async def start(self) -> None:
        control = self.config.socket
        control.parent.mkdir(parents=True, exist_ok=True)
        with _umask(0o177):
            _unlink_stale(control)
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(f"ipc://{control}")
        if self.config.control_group:
            os.chown(control, 0, grp.getgrnam(self.config.control_group).gr_gid)
            os.chmod(control, 0o660)
        users = self.config.user_socket
        users.parent.mkdir(parents=True, exist_ok=True)
        _unlink_stale(users)
        self._users = await asyncio.start_unix_server(
            self._serve_user, path=str(users), limit=MAX_USER_REQUEST
        )
        os.chmod(users, 0o666)
        if self.config.api_address:
            from bbstage.daemon import netapi

            self._api = netapi.Api(self, self.config.api_address, self.config.munge_socket)
            await self._api.start()
        log.info("listening", control=str(control), user=str(users),
                 api=self.config.api_address or None)  # fmt: skip

    async def serve_forever(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            task = asyncio.create_task(self._serve_hook(frames))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_hook(self, frames: list[bytes]) -> None:
        # A REQ peer's message: [routing id, empty delimiter, request]
        if len(frames) != 3 or frames[1] != b"":
            log.warning("malformed message", frames=len(frames))
            return
        try:
            request = protocol.decode_request(frames[2], protocol.HOOK_OPS)
            job = self.engine.job(request.job_id) if self.draining else None
            if self.draining and not drain.answers(request.op, job and job.state):
                reply = Reply.again(f"{drain.WHY}: ask again")
            else:
                reply = await self.engine.handle(request)  # answers its own bugs
        except ProtocolError as exc:
            reply = Reply.error(f"bad request: {exc}")
        except Exception as exc:
            log.exception("hook request failed: internal error")
            reply = Reply.error(internal_error(exc, "hook request", "?"))
        assert self._router is not None
        await self._router.send_multipart([frames[0], b"", *protocol.reply_frames(reply)])

    async def _serve_user(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = None
        try:
            sock = writer.get_extra_info("socket")
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, peer, _gid = struct.unpack("3i", creds)
            if not self.admit(peer):
                body = protocol.encode_user_reply(ERROR, message=self.busy(peer))
            else:
                uid = peer
                try:
                    line = await asyncio.wait_for(reader.readline(), USER_READ_TIMEOUT)
                    body = await self.respond(line, uid)
                except (ValueError, asyncio.LimitOverrunError, TimeoutError):
                    body = protocol.encode_user_reply(ERROR, message="bad request")
            writer.write(body)
            await asyncio.wait_for(writer.drain(), USER_WRITE_TIMEOUT)
        except (ConnectionError, OSError, TimeoutError):
            pass
        finally:
            if uid is not None:
                self.release(uid)
            writer.close()

    async def respond(self, line: bytes, uid: int, origin: str | None = None) -> bytes:
        """The one handler of users' requests, whichever transport brought them: ``line``
        (a JSON request) from ``uid`` (the kernel's word on the Unix socket, munge's on the
        API; never the request's), answered with what ``uid`` may see or do. ``origin``: the
        network API's peer address (an in-job copy must come from one of the job's nodes)."""
        try:
            request = protocol.decode_request(line, protocol.USER_OPS)
        except ProtocolError as exc:
            return protocol.encode_user_reply(ERROR, message=f"bad request: {exc}")
        try:
            return await self._answer_user(request, uid, origin)
        except Exception as exc:  # a bug: answered as one, not as the user's mistake
            log.exception("user request failed: internal error", op=request.op, uid=uid)
            message = internal_error(exc, request.op, request.get("job_id"))
            return protocol.encode_user_reply(ERROR, message=message)

    def release(self, uid: int) -> None:
        self._open[uid] -= 1
        if not self._open[uid]:
            del self._open[uid]

    def admit(self, uid: int) -> bool:
        """Count a new connection of ``uid`` unless it is over a limit (see USER_CONNECTIONS)."""
        if self._open[uid] >= USER_CONNECTIONS_PER_UID:
            return False
        if self._open.total() >= USER_CONNECTIONS:
            return False
        self._open[uid] += 1
        return True

    def busy(self, uid: int) -> str:
        if self._open[uid] >= USER_CONNECTIONS_PER_UID:
            why = f"{self._open[uid]} connections of uid {uid} are open"
        else:
            why = f"{self._open.total()} connections are open"
        return f"staging daemon busy: {why}; try again in a moment"

    async def _answer_user(
        self, request: protocol.Request, uid: int, origin: str | None = None
    ) -> bytes:
        engine, admin = self.engine, self.config.admin_group
        if request.op == "ping":
            return protocol.encode_user_reply(OK, result={"uid": uid})
        if request.op == "status":
            job = engine.job(request.job_id)
            if job is None or not report.may_see(admin, uid, job):
                return protocol.encode_user_reply(ERROR, message=not_yours(request.job_id))
            status = report.job_status(job, engine.attempts(job.job_id), self._why,
                                       engine.usage.of(job.job_id))  # fmt: skip
            return protocol.encode_user_reply(OK, result=status)
        if request.op == "drain":
            return self._drain(request, uid, origin)
        if request.op == "copy" and self.draining:
            return protocol.encode_user_reply(AGAIN, message=f"{drain.WHY}: ask again")
        if request.op in ("copy", "cancel"):
            return await self._copy(request, uid, origin)
        if request.op == "jobs":
            # Every job kept for retention_days: read in a thread, not on the hooks' loop.
            return await asyncio.to_thread(self._jobs, uid)
        return protocol.encode_user_reply(OK, result=engine.pools())

    def _drain(self, request: protocol.Request, uid: int, origin: str | None) -> bytes:
        """``bbstage drain``: root on this host only (the Unix socket, never the API)."""
        if uid != 0 or origin is not None:
            return protocol.encode_user_reply(ERROR, message="drain: for root on this host")
        deadline = request.get("deadline")
        if not isinstance(deadline, int | float) or isinstance(deadline, bool) or deadline < 0:
            return protocol.encode_user_reply(ERROR, message="drain: deadline: seconds, >= 0")
        executor = self.engine.executor
        running, queued = executor.running, executor.queued
        if not self.draining:
            self.draining = True
            (staged.directory(self.config) / drain.MARK).touch()  # the gap: hooks wait
            executor.hold()  # what waits in the queue stays there, for the next daemon
            log.warning("draining", deadline=deadline, running=running, queued=queued)
            task = asyncio.create_task(drain.until_idle(
                lambda: executor.running > 0,
                time.monotonic() + deadline, self.stop))  # fmt: skip
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return protocol.encode_user_reply(OK, result={"running": running, "queued": queued})

    async def _copy(self, request: protocol.Request, uid: int, origin: str | None) -> bytes:
        """``copy`` (start an in-job copy, or add one --at-end) and ``cancel``: only for the
        caller's own job, which must be running (the record; and Slurm's word with
        ``job_check = "slurm"``, which also checks that a request over the network API came
        from one of the job's nodes)."""
        engine, job_id = self.engine, request.job_id
        job = engine.job(job_id)
        if job is None or job.uid != uid:
            return protocol.encode_user_reply(ERROR, message=not_yours(job_id))
        try:
            if request.op == "cancel":
                index = request.get("index")
                if not isinstance(index, int) or isinstance(index, bool):
                    raise ProtocolError("cancel: index must be a number")
                d = await engine.cancel_copy(job, index)
                return protocol.encode_user_reply(OK, result={"id": f"{job_id}:{d.idx}",
                                                              "state": d.state})  # fmt: skip
            options = {k: str(request.get(k)) for k in ("checksum", "overwrite", "profile")
                       if request.get(k) is not None}  # fmt: skip
            source, destination = request.get("source"), request.get("destination")
            if not isinstance(source, str) or not isinstance(destination, str):
                raise ProtocolError("copy: source and destination must be strings")
            if self.config.job_check == "slurm":
                conf = str(self.config.slurm_conf) if self.config.slurm_conf else None
                why = await jobcheck.running_as(job_id, uid, conf, origin)
                if why is not None:
                    raise Refused(why)
                job = engine.job(job_id) or job
            d = engine.add_copy(job, source, destination, options, request.get("at_end") is True)
        except (Refused, ProtocolError) as exc:
            return protocol.encode_user_reply(ERROR, message=f"{request.op}: {exc}")
        return protocol.encode_user_reply(OK, result={"id": f"{job_id}:{d.idx}", "index": d.idx})

    def _jobs(self, uid: int) -> bytes:
        """The ``jobs`` reply: the caller's own jobs (selected in SQL), every job for root
        and the admin group."""
        engine = self.engine
        jobs = engine.jobs_of(None if report.is_admin(self.config.admin_group, uid) else uid)
        summary = report.jobs_summary(jobs, engine.nodes(), self._why)
        return protocol.encode_user_reply(OK, result=summary)

    def _why(self, key: str) -> str | None:
        """Why a transfer waits for a slot (the executor's fair share), if it does."""
        return self.engine.executor.why(key)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._users is not None:
            self._users.close()
        if self._api is not None:
            await self._api.close()
        if self._router is not None:
            self._router.close(0)
        self._ctx.term()
        for path in (self.config.socket, self.config.user_socket):
            _unlink_stale(path)


def _unlink_stale(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)
