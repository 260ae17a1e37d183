--[[
bbstage/async.lua: the asynchronous hooks of burst_buffer.lua (docs/install.md). Slurm runs
them in slurmscriptd children, each in a fresh Lua state; each sends one request to the bbstage
daemon over ZeroMQ (lua/bbstage/hooks.lua, lua/bbstage/zmtp.lua) and returns its verdict.
burst_buffer.lua loads this file at the first asynchronous call and calls what it returns with
its site values and its script reader; that defines the hooks as globals, as Slurm calls them.
--]]

local module = ...

return function(site, read_script, array_of)

	-- An asynchronous hook: send one request to the daemon (see lua/bbstage/hooks.lua).
	-- A Lua error becomes a readable reason (Slurm would show "(null)").
	local function forward(op, timeout, job_id, job_script, uid, gid, job_info, extra)
		local ok, rc, message, kind = pcall(function()
			local script = job_script and read_script(job_script, array_of(job_id, job_info))
			return module("hooks").forward(module("zmtp"), site.socket, op, timeout, job_id,
				script, uid, gid, job_info, extra)
		end)
		if ok then return rc, message, kind end
		return slurm.ERROR, "bbstage " .. op .. " hook failed: " .. tostring(rc)
	end

	-- test_data_in/out (24.05+): Slurm calls them again every PollInterval while they answer
	-- BUSY, within StageIn/StageOutTimeout. A daemon that does not answer (restarting) counts
	-- as "not done yet"; held for it, the job would stay in staging-in after `scontrol release`.
	-- The script's path (not the script) lets a daemon that lost the job find its leftovers.
	local function poll(op, job_id, job_script, uid, gid, job_info)
		local rc, message, kind = forward(op, 60, job_id, nil, uid, gid, job_info,
			{ script_path = job_script })
		if kind == "unreachable" or kind == "timeout" then return slurm.SUCCESS, "BUSY" end
		return rc, message
	end

	-- Only 24.05+ polls test_data_in/out (and defines slurm.SLURM_BB_BUSY); 23.x already
	-- passes uid to data_in but takes its return as "staged", so a uid proves nothing.
	local function polled() return slurm.SLURM_BB_BUSY ~= nil end

	-- Create the job's record and scratch space (22.05 gives uid and gid only here). Where
	-- data_in blocks (before 24.05), the daemon starts staging in now: data_in comes next.
	-- For a task split off an array the daemon mends Slurm's directory (bbstage/daemon/slurmdirs.py).
	function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script, job_info)
		local array = array_of(job_id, job_info)
		return forward("setup", 300, job_id, job_script, uid, gid, job_info,
			{ pool = pool, size = bb_size, stage_in = not polled(),
			  array_job_id = array and tostring(array), script_path = array and job_script })
	end

	-- The daemon leaves an empty file <site.staged>/<job id> once the job's stage-in is done
	-- (bbstage/daemon/staged.py): then data_in and test_data_in need not ask it.
	local function staged_in(job_id)
		local f = site.staged and io.open(site.staged .. "/" .. tostring(job_id))
		if f then f:close() end
		return f ~= nil
	end

	-- data_in/data_out. Before 24.05 the call blocks and Slurm takes any success as "staged":
	-- only the daemon's "ok" may be one (a "busy" would start the job on partial inputs).
	-- 24.05+: the call only starts the transfers; test_data_in/out poll.
	local function stage(op, job_id, job_script, uid, gid, job_info)
		local blocking = not polled()
		local rc, message = forward(op, nil, job_id, job_script, uid, gid, job_info,
			{ wait = blocking })
		if blocking and rc == slurm.SUCCESS and message == "BUSY" then
			return slurm.ERROR, "bbstage: " .. op .. " of job " .. tostring(job_id) .. " not finished"
		end
		return rc, message
	end

	-- Stage in. Before 24.05: block until staged. 24.05+: start, then test_data_in polls.
	function slurm_bb_data_in(job_id, job_script, uid, gid, job_info)
		if staged_in(job_id) then return slurm.SUCCESS end
		return stage("data_in", job_id, job_script, uid, gid, job_info)
	end

	function slurm_bb_test_data_in(job_id, job_script, uid, gid, job_info)
		if staged_in(job_id) then return slurm.SUCCESS end
		return poll("test_data_in", job_id, job_script, uid, gid, job_info)
	end

	function slurm_bb_pre_run(job_id, job_script, uid, gid, job_info)
		return forward("pre_run", 60, job_id, nil, uid, gid, job_info)
	end

	-- Stage out: like data_in.
	function slurm_bb_data_out(job_id, job_script, uid, gid, job_info)
		return stage("data_out", job_id, job_script, uid, gid, job_info)
	end

	function slurm_bb_test_data_out(job_id, job_script, uid, gid, job_info)
		return poll("test_data_out", job_id, job_script, uid, gid, job_info)
	end

	-- After the job, or on cancel (hurry "true": abort transfers now). Removes scratch.
	-- The script's path lets a daemon that lost the job find its temporary files.
	function slurm_bb_job_teardown(job_id, job_script, hurry, uid, gid)
		return forward("teardown", 300, job_id, nil, uid, gid, nil,
			{ hurry = hurry == "true" or hurry == true, script_path = job_script })
	end

	-- `scontrol show bbstat [JOBID]`. 24.05+ passes the caller's uid and gid first.
	function slurm_bb_get_status(...)
		local args, uid = { ... }, nil
		-- Only 24.05+ defines slurm.SLURM_BB_BUSY. Guessing from the arguments would let a 22.05
		-- user claim any uid (`scontrol show bbstat 1001 1001`) and see that user's paths.
		if polled() and #args >= 2 then
			uid = tostring(table.remove(args, 1))
			table.remove(args, 1)
		end
		for i, v in ipairs(args) do args[i] = tostring(v) end
		return module("hooks").call(module("zmtp"), site.socket, "get_status",
			{ args = args, uid = uid }, 30)
	end

end
