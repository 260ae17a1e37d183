"""`bbstage validate`: summary, errors, JSON output and exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from bbstage import movers
from bbstage.cli.main import main
from bbstage.cli.validate import run

GOOD = """#!/bin/bash
#SBATCH -t 10
#BB_LUA stage_in source=/data/u/input.dat destination=/fast/u/input.dat
#BB_LUA stage_in source=/data/u/refs/ destination=$BB_SCRATCH/refs/ checksum=xxh3
#BB_LUA stage_out source="/fast/u/my result.dat" destination=s3://bucket/results/out.dat
#BB_LUA pool=scratch capacity=10G
./app
"""

BAD = """#!/bin/bash
#BB_LUA stage_in source=data/x destination=/fast/x
#BB_LUA stage_sideways
#BB_LUA pool=p capacity=10GB
"""


def _run(path: Path | str, as_json: bool = False) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run(str(path), as_json, movers.Registry(), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_valid_script_summary(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(GOOD)
    code, out, err = _run(script)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"{script}: OK"
    assert lines[1] == "3 staging directives"
    assert lines[2].startswith("  [0] line 3: in  file /data/u/input.dat -> /fast/u/input.dat")
    assert "checksum=xxh3" in lines[3] and "tree" in lines[3]
    assert '"/fast/u/my result.dat" -> s3://bucket/results/out.dat' in lines[4]
    assert lines[5] == "pool: scratch, capacity: 10G (10737418240 bytes)"


def test_no_directives(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#BB_LUA\n./app\n")
    code, out, _ = _run(script)
    assert code == 0
    assert out.splitlines()[1:] == ["0 staging directives", "pool: none, capacity: none"]


def test_errors_on_stderr(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(BAD)
    code, out, err = _run(script)
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f'{script}: line 2: stage_in: relative path "data/x" in source')
    assert lines[1].startswith(f"{script}: line 3: unknown verb")
    assert lines[2].startswith(f"{script}: line 4: bad capacity")


def test_error_cap_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n" + "#BB_LUA nope\n" * 25)
    code, _, err = _run(script)
    assert code == 1
    assert err.splitlines()[-1].endswith("stopped after 20 errors")


def test_json_output(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.sh", tmp_path / "bad.sh"
    good.write_text(GOOD)
    bad.write_text(BAD)
    code, out, err = _run(good, as_json=True)
    assert code == 0 and err == ""
    result = json.loads(out)
    assert result["capacity"] == 10737418240 and len(result["directives"]) == 3
    code, out, err = _run(bad, as_json=True)
    assert code == 1 and err == ""
    assert [e["code"] for e in json.loads(out)["errors"]] == [
        "relative-path",
        "unknown-verb",
        "bad-size",
    ]


def test_unreadable(tmp_path: Path) -> None:
    code, out, err = _run(tmp_path / "missing.sh")
    assert code == 2 and out == ""
    assert "cannot read" in err and "missing.sh" in err
    code, _, err = _run(tmp_path)  # a directory
    assert code == 2 and "cannot read" in err
    code, out, _ = _run(tmp_path / "missing.sh", as_json=True)
    assert code == 2 and out == ""


def test_invalid_utf8_counts_bytes(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    # 4096-byte line made of a prefix and undecodable bytes: exactly at the limit
    prefix = b"#BB_LUA stage_in destination=/x/y source=/d/"
    script.write_bytes(b"#!/bin/sh\n" + prefix + b"\xff" * (4096 - len(prefix)) + b"\n")
    code, out, err = _run(script)
    assert code == 0, err
    assert "\ufffd" in out
    script.write_bytes(b"#!/bin/sh\n" + prefix + b"\xff" * (4097 - len(prefix)) + b"\n")
    code, _, err = _run(script)
    assert code == 1 and "4097 bytes" in err


# A DataWarp script as NERSC's example (with the pool= Slurm's burst_buffer/lua needs), and a
# late #BB_LUA line: the issue measured both as "OK, 0 staging directives", silently.
DATAWARP = """#!/bin/bash
#SBATCH --nodes=2
#DW jobdw capacity=10GB access_mode=striped type=scratch pool=sm_pool
#DW stage_in source=/global/u/dwtest-file destination=$DW_JOB_STRIPED/dwtest-file type=file
#DW stage_out source=$DW_JOB_STRIPED/out destination=/global/u/out type=directory
srun ls ${DW_JOB_STRIPED}/dwtest-file
#BB_LUA stage_out source=$BB_SCRATCH/late.dat destination=/global/u/late.dat
"""


def test_datawarp_script_and_late_line(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(DATAWARP)
    code, out, err = _run(script)
    assert code == 0  # Slurm accepts the job: a warning, not an error
    assert err == (
        f"{script}: warning: line 7: #BB_LUA line after the first command (line 6) is "
        "ignored by Slurm: move it above line 6\n"
    )
    assert out.splitlines() == [
        f"{script}: OK",
        "2 staging directives",
        "  [0] line 4: in  file /global/u/dwtest-file -> $BB_SCRATCH/dwtest-file  "
        "(checksum=none overwrite=always)",
        "  [1] line 5: out tree $BB_SCRATCH/out/ -> /global/u/out/  "
        "(checksum=none overwrite=always)",
        "pool: sm_pool, capacity: 9765625K (10000000000 bytes)",
        "scratch: $BB_SCRATCH, also $DW_JOB_STRIPED, $DW_JOB_PRIVATE",
        "#DW lines reach the hooks only where burst_buffer.conf has Directive=DW, or with a "
        "#BB_LUA line in the script (docs/install.md)",
    ]
    code, out, err = _run(script, as_json=True)
    assert code == 0 and err == ""
    assert [w["line"] for w in json.loads(out)["warnings"]] == [7]


def test_refused_dw_line_names_it(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#DW jobdw capacity=1GiB pool=p\n#DW swap 1GiB\n./app\n")
    code, out, err = _run(script)
    assert code == 1 and out == ""
    assert err == (f"{script}: line 3: #DW swap: bbstage gives no swap space: remove the line\n")


def test_a_url_to_a_host_the_site_has_not_allowed_names_line_host_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bbstage validate` reads the site's config (--config) as the daemon does: its enabled
    backends and their ``allowed_hosts``, so it refuses what sbatch would."""
    config = tmp_path / "bbstage.toml"
    config.write_text(
        '[backends]\nenabled = ["https"]\n[https]\nallowed_hosts = ["data.example.org"]\n'
    )
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#BB_LUA stage_in source=https://data.example.org/a destination=/fast/a\n"
        "#BB_LUA stage_in source=https://data.example.org:8443/b destination=/fast/b\n"
    )
    code = main(["--config", str(config), "validate", str(script)])
    err = capsys.readouterr().err
    assert code == 1
    assert err == (
        f"{script}: line 3: stage_in: host data.example.org:8443 in source"
        ' "https://data.example.org:8443/b" is not allowed on this site: the administrator may'
        ' add "data.example.org:8443" to [https] allowed_hosts in the daemon config\n'
    )
