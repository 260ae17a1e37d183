-- Baseline for bench_job_process.py: a minimal burst_buffer.lua in the shape of Slurm's
-- burst_buffer.lua.example (our own code, written for comparison, not Slurm's):
-- slurm_bb_job_process reads the job script and looks for each stage kind once with
-- string.find; every other function Slurm requires is there and does nothing.
function slurm_bb_job_process(job_script, uid, gid, job_info)
	io.input(job_script)
	local contents = io.read("*all")
	io.input():close()
	local stage_in = string.find(contents, "#BB_LUA stage_in", 1, true)
	local stage_out = string.find(contents, "#BB_LUA stage_out", 1, true)
	if not (stage_in or stage_out) then return slurm.ERROR, "no staging directive" end
	return slurm.SUCCESS
end

function slurm_bb_pools() return slurm.SUCCESS end
function slurm_bb_job_teardown(job_id, job_script, hurry, uid, gid) return slurm.SUCCESS end
function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script, job_info) return slurm.SUCCESS end
function slurm_bb_data_in(job_id, job_script, uid, gid, job_info) return slurm.SUCCESS end
function slurm_bb_test_data_in(job_id, job_script, uid, gid, job_info) return slurm.SUCCESS end
function slurm_bb_real_size(job_id, uid, gid, job_info) return slurm.SUCCESS end
function slurm_bb_paths(job_id, job_script, path_file, uid, gid, job_info) return slurm.SUCCESS end
function slurm_bb_pre_run(job_id, job_script, uid, gid, job_info) return slurm.SUCCESS end
function slurm_bb_post_run(job_id, job_script, uid, gid, job_info) return slurm.SUCCESS end
function slurm_bb_data_out(job_id, job_script, uid, gid, job_info) return slurm.SUCCESS end
function slurm_bb_test_data_out(job_id, job_script, uid, gid, job_info) return slurm.SUCCESS end
function slurm_bb_get_status(...) return slurm.SUCCESS, "" end
