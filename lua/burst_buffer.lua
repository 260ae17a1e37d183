--[[
bbstage: burst_buffer.lua for Slurm's burst_buffer/lua plugin (Slurm 22.05 and 24.05+).

Slurm compiles burst_buffer.lua into a fresh Lua state on every call. So `bbstage install-lua`
installs this file as bbstage/main.lua, compiled to bbstage/main.luac for the Lua the site's
Slurm links, and writes a burst_buffer.lua of a few lines that loads it (bbstage/luainstall.py).
  * Synchronous hooks (job_process, pools, paths) run inside slurmctld while it holds
    locks: they only parse, with lua/bbstage/directives.lua; no socket, no process.
  * Asynchronous hooks run in slurmscriptd children: each sends one request to the
    bbstage daemon over ZeroMQ (lua/bbstage/zmtp.lua) and returns its verdict.
The wire protocol is docs/protocol.md; the directive grammar is docs/directives.md.
Install with `bbstage install-lua --dest <dir of slurm.conf>`, which also writes
bbstage_site.lua (socket path and pools) from the daemon's config file.
--]]

-- Installed, the generated burst_buffer.lua passes its directory and the modules' suffix
-- (".luac" when compiled for this Lua); run as burst_buffer.lua itself, the sources are used.
local HERE, SUFFIX = ...
if type(HERE) ~= "string" then
	HERE, SUFFIX = debug.getinfo(1, "S").source:match("^@(.*/)") or "./", ".lua"
end
local site = { socket = "/run/bbstage/control.sock", pools = {} }
do
	local chunk = loadfile(HERE .. "bbstage_site.lua")
	local ok, values = pcall(chunk or error)
	if ok and type(values) == "table" then site = values end
end

-- Load lua/bbstage/<name>.lua (installed: .luac). Bytecode that does not load (another Lua's)
-- is never a silent slowdown: the source is used and slurmctld's log says so.
local function module(name)
	local base = HERE .. "bbstage/" .. name
	local chunk, err = loadfile(base .. SUFFIX)
	if not chunk and SUFFIX == ".luac" then
		slurm.log_error("bbstage: %s; running the Lua sources instead, slower on every call:"
			.. " run `bbstage install-lua` again", tostring(err))
		SUFFIX = ".lua" -- once per Lua state (per hook call)
		chunk, err = loadfile(base .. SUFFIX)
	end
	-- a module may load its own (hooks.lua: directives.lua); directives.lua reads site.schemes
	return assert(chunk, err)(module, site)
end

-- A task split off a job array, with its own id (24.05+ say so in job_info): the array's id.
local function array_of(job_id, job_info)
	local a = job_info and tonumber(job_info.array_job_id)
	-- Slurm pushes it with lua_pushnumber: under Lua 5.3+ a float, 123.0, that .. would write
	-- as "123.0" (a wrong script path); floor gives the integer 123.
	a = a and math.floor(a)
	if a and a ~= 0 and a ~= tonumber(job_id) then return a end
end

-- The whole job script (Slurm gives its path; a Lua error fails the hook with the reason).
-- Slurm names a split-off array task's script by the task's id before that file exists (the
-- daemon links it at setup: bbstage/slurmdirs.py); until then the array's script is the one.
local function read_script(path, array)
	local f = io.open(path, "rb")
	if not f and array then
		f = io.open((path:gsub("hash%.%d/job%.%d+/script$",
			"hash." .. array % 10 .. "/job." .. array .. "/script")), "rb")
	end
	f = f or assert(io.open(path, "rb"))
	local text = f:read("*a")
	f:close()
	return text
end

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

--[[ Synchronous hooks: parse only. ]]

-- At submission: reject a bad #BB_LUA or #DW directive with the line and what to fix.
-- A staging line after the first command is no error (Slurm accepts the job, as with a late
-- #SBATCH): slurmctld's log gets it, and the user where slurm.log_user works. In 25.11+ it
-- calls slurm.user_msg, which only job_submit/lua defines (docs/install.md): hence the test.
function slurm_bb_job_process(job_script, uid, gid, job_info)
	local result = module("directives").parse(read_script(job_script))
	if #result.errors > 0 then
		local messages = {}
		for i = 1, math.min(#result.errors, 3) do messages[i] = result.errors[i].message end
		return slurm.ERROR, table.concat(messages, "; ")
	end
	for _, w in ipairs(result.warnings) do
		slurm.log_info("bbstage: %s (uid %s): %s", tostring(job_script), tostring(uid), w.message)
		if slurm.log_user and slurm.user_msg then pcall(slurm.log_user, "%s", w.message) end
	end
	return slurm.SUCCESS
end

-- The pools Slurm accounts for (capacity= pool=), from bbstage_site.lua.
function slurm_bb_pools()
	local items = {}
	for i, p in ipairs(site.pools or {}) do
		items[i] = string.format('{"id":%s,"quantity":%d,"granularity":%d}',
			string.format("%q", p.name), p.quantity, p.granularity)
	end
	return slurm.SUCCESS, '{"pools":[' .. table.concat(items, ",") .. "]}"
end

-- Environment for the job: BB_SCRATCH, the job's own scratch directory, and for a script with
-- #DW lines the same directory as DW_JOB_STRIPED, DW_JOB_PRIVATE and DW_JOB_<jobdw name>.
-- paths runs inside slurmctld, under its locks: the script is parsed only when that matters
-- (several pools, where pool= chooses; or "DW" somewhere in it).
function slurm_bb_paths(job_id, job_script, path_file, uid, gid, job_info)
	local pools = site.pools or {}
	if #pools == 0 then return slurm.SUCCESS end
	local chosen, names = pools[1], {}
	local ok, text = pcall(read_script, job_script, array_of(job_id, job_info))
	if not ok and #pools > 1 then error(text) end
	if ok and (#pools > 1 or string.find(text, "DW", 1, true)) then
		local parsed = module("directives").parse(text)
		names = parsed.scratch_names
		for _, p in ipairs(pools) do
			if p.name == parsed.pool then chosen = p end
		end
	end
	local f, err = io.open(path_file, "a")
	if not f then return slurm.ERROR, "cannot write path file: " .. tostring(err) end
	local dir = chosen.root .. "/" .. job_id
	f:write("BB_SCRATCH=", dir, "\n")
	for _, name in ipairs(names) do f:write(name, "=", dir, "\n") end
	f:close()
	return slurm.SUCCESS
end

--[[ Asynchronous hooks: one request to the daemon each. ]]

-- Only 24.05+ polls test_data_in/out (and defines slurm.SLURM_BB_BUSY); 23.x already
-- passes uid to data_in but takes its return as "staged", so a uid proves nothing.
local function polled() return slurm.SLURM_BB_BUSY ~= nil end

-- Create the job's record and scratch space (22.05 gives uid and gid only here). Where
-- data_in blocks (before 24.05), the daemon starts staging in now: data_in comes next.
-- For a task split off an array the daemon mends Slurm's directory (bbstage/slurmdirs.py).
function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script, job_info)
	local array = array_of(job_id, job_info)
	return forward("setup", 300, job_id, job_script, uid, gid, job_info,
		{ pool = pool, size = bb_size, stage_in = not polled(),
		  array_job_id = array and tostring(array), script_path = array and job_script })
end

-- The daemon leaves an empty file <site.staged>/<job id> once the job's stage-in is done
-- (bbstage/staged.py): then data_in and test_data_in need not ask it.
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

-- Slurm only uses a size larger than the job asked for; bbstage never grows a buffer
-- beyond capacity=, so there is nothing to ask the daemon (and a hook less per job).
function slurm_bb_real_size(job_id, uid, gid, job_info)
	return slurm.SUCCESS
end

function slurm_bb_pre_run(job_id, job_script, uid, gid, job_info)
	return forward("pre_run", 60, job_id, nil, uid, gid, job_info)
end

-- Nothing to do between the job's end and stage-out: data_out follows at once.
function slurm_bb_post_run(job_id, job_script, uid, gid, job_info)
	return slurm.SUCCESS
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
