"""A malformed mapped-credentials file (audit #11): configparser's errors quote its raw
lines, which hold other users' keys; the job is told only that the file is malformed, the
details go to root's log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bbstage.movers.implementations.s3.settings import s3_options

SECRET = "wJalrXUtnFEMIOTHERUSERSSECRETKEY"

MALFORMED = {
    "a stray line": f"[u1]\naws_access_key_id = AKIA1\naws_secret_access_key = S1\n"
    f"[u2]\naws_access_key_id = AKIA2\n{SECRET}\n",
    "no section header": f"aws_secret_access_key = {SECRET}\n[u1]\naws_access_key_id = A\n",
    "a key twice": f"[u2]\naws_secret_access_key = {SECRET}\naws_secret_access_key = {SECRET}\n",
}


@pytest.mark.parametrize("how", sorted(MALFORMED))
def test_a_malformed_credentials_file_reaches_the_job_as_a_generic_message(
    tmp_path: Path, how: str
) -> None:
    creds = tmp_path / "s3-credentials"
    creds.write_text(MALFORMED[how])
    os.chmod(creds, 0o600)
    conf = {"accounts": {"daemon": {"profile": "u1", "credentials_file": str(creds)}}}
    with capture_logs() as logs:
        options = s3_options(conf, 1, None)  # uid 1: daemon
    error = options.credentials_error
    assert error is not None and SECRET not in error and options.credentials is None
    assert error == (
        "the site's mapped-credentials file is malformed: ask your administrator"
        " (the daemon's log says where)"
    )
    [logged] = [e for e in logs if e["event"] == "mapped-credentials file malformed"]
    assert logged["path"] == str(creds) and logged["log_level"] == "error"
    assert logged["error"]  # what configparser said, for root's eyes
