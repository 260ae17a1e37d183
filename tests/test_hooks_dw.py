"""The synchronous hooks on #DW scripts and late staging lines, outside Slurm.

``slurm_bb_paths`` gives the job DW_JOB_STRIPED, DW_JOB_PRIVATE and DW_JOB_<name> for a script
with #DW lines; ``slurm_bb_job_process`` accepts a script with a late staging line, logs it,
and tells the user only where ``slurm.log_user`` can work: Slurm 25.11+ defines
``slurm.log_user`` in every Lua state, but it calls ``slurm.user_msg``, which only
job_submit/lua defines, so calling it blindly from burst_buffer.lua would fail the hook.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .helpers import file_digest, make_tree, tree_digests
from .hookharness import Daemon, area, daemon, user_ids, user_tree  # noqa: F401 (fixtures)
from .luas import interpreter, lua_fixture

REPO = Path(__file__).resolve().parent.parent

lua = lua_fixture()

# Stand-in for Slurm's `slurm` table; LOG_USER picks what 22.05-24.11 (none), 25.11+ in
# burst_buffer/lua (log_user without user_msg) and job_submit/lua (both) give.
DRIVER = r"""
local dir, hook, log_user = arg[1], arg[2], arg[3]
slurm = { SUCCESS = 0, ERROR = -1, log_error = function() end }
slurm.log_info = function(fmt, ...) io.write("log_info: ", string.format(fmt, ...), "\n") end
if log_user ~= "none" then
	local unpack = table.unpack or unpack
	slurm.log_user = function(...) slurm.user_msg(string.format(unpack({ ... }))) end
end
if log_user == "works" then
	slurm.user_msg = function(msg) io.write("user_msg: ", msg, "\n") end
end
dofile(dir .. "/burst_buffer.lua")
local args = {}
for i = 4, #arg do args[i - 3] = arg[i] end
local rc, message = _G[hook]((table.unpack or unpack)(args, 1, #arg - 3))
io.write("rc=", tostring(rc), " ", tostring(message or ""), "\n")
"""

NNF = b"""#!/bin/bash
#SBATCH -N 1
#DW jobdw type=xfs capacity=1GiB name=fast-storage pool=p
#DW copy_in source=/lus/u/in.dat destination=$DW_JOB_fast_storage/in.dat
./app
#DW copy_out source=$DW_JOB_fast_storage/out.dat destination=/lus/u/out.dat
"""


def _install(tmp: Path, pools: str) -> Path:
    etc = tmp / "etc"
    etc.mkdir()
    shutil.copy(REPO / "lua" / "burst_buffer.lua", etc / "burst_buffer.lua")
    (etc / "bbstage").symlink_to(REPO / "lua" / "bbstage")
    site = f'return {{ socket = "/nonexistent", pools = {pools} }}\n'
    (etc / "bbstage_site.lua").write_text(site)
    return etc


def _call(lua: str, etc: Path, hook: str, log_user: str, *args: str) -> str:
    driver = etc / "driver.lua"
    driver.write_text(DRIVER)
    out = subprocess.run(
        [interpreter(lua), str(driver), str(etc), hook, log_user, *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


POOLS = '{ { name = "p", root = "/scratch/p", quantity = 100, granularity = 1 } }'


def test_paths_export_dw_names(lua: str, tmp_path: Path) -> None:
    etc = _install(tmp_path, POOLS)
    script, env = tmp_path / "script", tmp_path / "env"
    script.write_bytes(NNF)
    out = _call(lua, etc, "slurm_bb_paths", "none", "42", str(script), str(env), "1000", "1000")
    assert out.endswith("rc=0 \n")
    assert env.read_bytes() == (
        b"BB_SCRATCH=/scratch/p/42\nDW_JOB_STRIPED=/scratch/p/42\n"
        b"DW_JOB_PRIVATE=/scratch/p/42\nDW_JOB_fast_storage=/scratch/p/42\n"
    )
    # a #BB_LUA script gets BB_SCRATCH alone, as before
    script.write_bytes(b"#!/bin/bash\n#BB_LUA stage_in source=/a destination=$BB_SCRATCH/a\n")
    env.unlink()
    _call(lua, etc, "slurm_bb_paths", "none", "43", str(script), str(env), "1000", "1000")
    assert env.read_bytes() == b"BB_SCRATCH=/scratch/p/43\n"


def test_job_process_late_line(lua: str, tmp_path: Path) -> None:
    etc = _install(tmp_path, POOLS)
    script = tmp_path / "script"
    script.write_bytes(NNF)
    message = (
        "line 6: #DW line after the first command (line 5) is ignored by Slurm: "
        "move it above line 5"
    )
    for log_user in ("none", "without-user_msg", "works"):
        out = _call(lua, etc, "slurm_bb_job_process", log_user, str(script), "1000", "1000")
        assert out.endswith("rc=0 \n"), (log_user, out)  # accepted, never a Lua error
        assert f"log_info: bbstage: {script} (uid 1000): {message}\n" in out
        assert (f"user_msg: {message}\n" in out) == (log_user == "works")


def test_job_process_refuses_persistentdw(lua: str, tmp_path: Path) -> None:
    etc = _install(tmp_path, POOLS)
    script = tmp_path / "script"
    script.write_bytes(b"#!/bin/bash\n#DW persistentdw name=shared-data\n./app\n")
    out = _call(lua, etc, "slurm_bb_job_process", "none", str(script), "1000", "1000")
    assert out == (
        "rc=-1 line 2: #DW persistentdw: persistent burst buffers do not exist with bbstage: "
        "stage the data from the shared file system in each job (#DW stage_in, #DW copy_in "
        "or #BB_LUA stage_in)\n"
    )


def test_nnf_script_staged_by_the_real_daemon(daemon: Daemon, area: Path) -> None:  # noqa: F811
    """An NNF script through the real hooks and a real daemon (no Slurm): a file and a
    directory in to scratch and out again, byte for byte; the job's environment names."""
    uid, gid = user_ids()
    src, out = area / "src", area / "out"
    src.mkdir()
    (src / "in.dat").write_bytes(os.urandom(1 << 20))
    make_tree(src / "tree", 12, 10_000, sub="deeper")
    out.mkdir()
    user_tree(src, uid, gid)
    user_tree(out, uid, gid)
    job = area / "job.sh"
    job.write_text(
        "#!/bin/bash\n#DW jobdw type=xfs capacity=64MiB name=fast-storage pool=scratch\n"
        f"#DW copy_in source={src}/in.dat destination=$DW_JOB_fast_storage/in.dat\n"
        f"#DW copy_in source={src}/tree/ destination=$DW_JOB_fast_storage/tree/\n"
        f"#DW copy_out source=$DW_JOB_fast_storage/in.dat destination={out}/out.dat\n"
        f"#DW copy_out source=$DW_JOB_fast_storage/tree/ destination={out}/tree/\n./app\n"
    )
    job.chmod(0o644)
    ids = ("77", str(uid), str(gid))
    assert daemon.hook("slurm_bb_job_process", str(job), str(uid), str(gid)) == (0, "")
    size = str(64 << 20)
    assert daemon.hook("slurm_bb_setup", *ids, "scratch", size, str(job)) == (0, "")
    env = area / "paths"
    assert daemon.hook("slurm_bb_paths", "77", str(job), str(env), str(uid), str(gid))[0] == 0
    scratch = area / "daemon" / "scratch" / "77"
    assert f"DW_JOB_fast_storage={scratch}\n" in env.read_text()
    assert daemon.hook("slurm_bb_data_in", "77", str(job)) == (0, "")
    assert file_digest(scratch / "in.dat") == file_digest(src / "in.dat")
    assert tree_digests(scratch / "tree") == tree_digests(src / "tree")
    assert daemon.hook("slurm_bb_data_out", "77", str(job)) == (0, "")
    assert file_digest(out / "out.dat") == file_digest(src / "in.dat")
    assert tree_digests(out / "tree") == tree_digests(src / "tree")
    assert len(tree_digests(out / "tree")) == 12
    assert daemon.hook("slurm_bb_job_teardown", "77", str(job), "false")[0] == 0
