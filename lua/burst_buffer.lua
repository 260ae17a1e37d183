--[[
bbstage: burst_buffer.lua for Slurm's burst_buffer/lua plugin (Slurm 22.05 and 24.05+).

Slurm compiles burst_buffer.lua into a fresh Lua state on every call. So `bbstage install-lua`
installs this file as bbstage/main.lua, compiled to bbstage/main.luac for the Lua the site's
Slurm links, and writes a burst_buffer.lua of a few lines that loads it (bbstage/cli/luainstall.py).
  * Synchronous hooks (job_process, pools, paths) run inside slurmctld while it holds
    locks: they only parse, with lua/bbstage/directives.lua; no socket, no process.
  * Asynchronous hooks run in slurmscriptd children: each sends one request to the
    bbstage daemon over ZeroMQ (lua/bbstage/zmtp.lua) and returns its verdict. Their code
    is lua/bbstage/async.lua, loaded only by them.
The wire protocol is docs/protocol.md; the directive grammar is docs/directives.md.
Install with `bbstage install-lua --dest <dir of slurm.conf>`, which also writes
bbstage_site.lua (socket path and pools) from the daemon's config file.
--]]

-- Installed, the generated burst_buffer.lua passes its directory, the modules' suffix (".luac"
-- when compiled for this Lua), the modules bundled into this file (directives: one file
-- less for job_process to load) and the values of bbstage_site.lua, which install-lua writes
-- with it (no call compiles that file); run as burst_buffer.lua itself, the sources are read.
local HERE, SUFFIX, BUNDLED, SITE = ...
if type(HERE) ~= "string" then
	HERE, SUFFIX = debug.getinfo(1, "S").source:match("^@(.*/)") or "./", ".lua"
end
local site = SITE
if type(site) ~= "table" then
	site = { socket = "/run/bbstage/control.sock", pools = {} }
	local chunk = loadfile(HERE .. "bbstage_site.lua")
	local ok, values = pcall(chunk or error)
	if ok and type(values) == "table" then site = values end
end

-- Load lua/bbstage/<name>.lua (installed: .luac). Bytecode that does not load (another Lua's)
-- is never a silent slowdown: the source is used and slurmctld's log says so.
local function module(name)
	if BUNDLED and BUNDLED[name] then return BUNDLED[name](module, site) end
	local base = HERE .. "bbstage/" .. name
	local chunk, err = loadfile(base .. SUFFIX)
	if not chunk and SUFFIX == ".luac" then
		slurm.log_error("bbstage: %s; running the Lua sources instead, slower on every call:"
			.. " run `bbstage install-lua` again", tostring(err))
		SUFFIX = ".lua" -- once per Lua state (per hook call)
		chunk, err = loadfile(base .. SUFFIX)
	end
	-- a module may load its own (hooks.lua: directives.lua); directives.lua reads site.schemes, site.grammar
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
-- daemon links it at setup: bbstage/daemon/slurmdirs.py); until then the array's script is the one.
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

--[[ Asynchronous hooks (lua/bbstage/async.lua): one request to the daemon each. Their code is
loaded by the first one a Lua state calls, so job_process (under slurmctld's locks) does not
pay for loading it; Slurm wants them all defined when it loads this file: these load them. ]]
local ASYNC = { "setup", "data_in", "test_data_in", "pre_run", "data_out", "test_data_out",
	"job_teardown", "get_status" }
for _, name in ipairs(ASYNC) do
	_G["slurm_bb_" .. name] = function(...)
		module("async")(site, read_script, array_of) -- defines the slurm_bb_ functions of ASYNC
		return _G["slurm_bb_" .. name](...)
	end
end

-- Slurm only uses a size larger than the job asked for; bbstage never grows a buffer
-- beyond capacity=, so there is nothing to ask the daemon (and a hook less per job).
function slurm_bb_real_size(job_id, uid, gid, job_info)
	return slurm.SUCCESS
end

-- Nothing to do between the job's end and stage-out: data_out follows at once.
function slurm_bb_post_run(job_id, job_script, uid, gid, job_info)
	return slurm.SUCCESS
end
