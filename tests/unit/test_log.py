"""The daemon's log lines: JSON, with the syslog priority prefix journald reads only when
stderr is the journal ($JOURNAL_STREAM names it; this machine runs no systemd, so a file
stands in for the journal's stream)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from bbstage import log


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = structlog.get_config()
    yield
    structlog.configure(**before)


def _stream(f: object) -> str:
    st = os.fstat(f.fileno())  # type: ignore[attr-defined]
    return f"{st.st_dev}:{st.st_ino}"


def test_each_level_gets_its_priority_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("debug", cache=False, journal=True)
    logger = structlog.get_logger("t")
    logger.debug("d", job_id="42")
    logger.info("i")
    logger.warning("w")
    logger.error("e")
    logger.critical("c")
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logger.exception("x")
    lines = capsys.readouterr().err.splitlines()
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>", "<3>"]
    records = [json.loads(line[3:]) for line in lines]  # what `journalctl -o cat` shows
    assert [r["event"] for r in records] == ["d", "i", "w", "e", "c", "x"]
    assert records[0]["job_id"] == "42"
    assert "second line" in records[-1]["exception"]  # a traceback stays on its one line


def test_no_prefix_off_the_journal(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("info", cache=False, journal=False)
    structlog.get_logger("t").warning("w")
    assert json.loads(capsys.readouterr().err)["level"] == "warning"


def test_journal_stream_must_name_stderr(tmp_path: Path) -> None:
    with open(tmp_path / "journal", "w") as journal, open(tmp_path / "other", "w") as other:
        env = {"JOURNAL_STREAM": _stream(journal)}
        assert log.journal_stream(journal, env)
        # A child of the service whose stderr went elsewhere inherits the variable.
        assert not log.journal_stream(other, env)
        assert not log.journal_stream(journal, {})
        for bad in ("", "12", "a:b", "1:2:3", ":"):
            assert not log.journal_stream(journal, {"JOURNAL_STREAM": bad})


def test_a_daemon_process_on_the_journal_prefixes_its_lines(tmp_path: Path) -> None:
    """A process whose stderr is the stream $JOURNAL_STREAM names, as systemd starts the
    unit, and one whose stderr is not."""
    code = (
        "import structlog; from bbstage import log; log.configure('info');"
        " structlog.get_logger('t').warning('w', job_id='7')"
    )
    for named in (True, False):
        path = tmp_path / f"stderr-{named}"
        with open(path, "w") as err:
            stream = _stream(err) if named else "1:1"
            env = {**os.environ, "JOURNAL_STREAM": stream}
            subprocess.run([sys.executable, "-c", code], stderr=err, env=env, check=True)
        line = path.read_text()
        assert line.startswith("<4>{") == named, line
        assert json.loads(line.removeprefix("<4>"))["job_id"] == "7"
