--[[
bbstage: burst_buffer.lua for Slurm's burst_buffer/lua plugin (Slurm 22.05 and 24.05+).

Slurm compiles this file into a fresh Lua state on every call, so it stays small.
  * Synchronous hooks (job_process, pools, paths) run inside slurmctld while it holds
    locks: they only parse, with lua/bbstage/directives.lua; no socket, no process.
  * Asynchronous hooks run in slurmscriptd children: each sends one request to the
    bbstage daemon over ZeroMQ (lua/bbstage/zmtp.lua) and returns its verdict.
The wire protocol is docs/protocol.md; the directive grammar is docs/directives.md.
Install with `bbstage install-lua --dest <dir of slurm.conf>`, which also writes
bbstage_site.lua (socket path and pools) from the daemon's config file.
--]]

local HERE = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local site = { socket = "/run/bbstage/control.sock", pools = {} }
do
	local chunk = loadfile(HERE .. "bbstage_site.lua")
	local ok, values = pcall(chunk or error)
	if ok and type(values) == "table" then site = values end
end

local function module(name)
	return dofile(HERE .. "bbstage/" .. name .. ".lua")
end

-- The whole job script, or nil and a message.
local function read_script(path)
	local f, err = io.open(path, "rb")
	if not f then return nil, "cannot read job script: " .. tostring(err) end
	local text = f:read("*a")
	f:close()
	return text
end

-- The directive header: every line before the first non-comment line (what counts).
local function header(text)
	local stop = text:find("\n[^#\r\n]")
	return stop and text:sub(1, stop) or text
end

-- Minimal JSON encoding for the flat request objects of docs/protocol.md.
local function json(value)
	local t = type(value)
	if t == "string" then
		return '"' .. value:gsub('[%c"\\]', function(c)
			return string.format("\\u%04x", c:byte())
		end) .. '"'
	elseif t == "boolean" or t == "number" then
		return tostring(value)
	elseif value[1] ~= nil or next(value) == nil then
		local items = {}
		for i, v in ipairs(value) do items[i] = json(v) end
		return "[" .. table.concat(items, ",") .. "]"
	end
	local items = {}
	for k, v in pairs(value) do items[#items + 1] = json(k) .. ":" .. json(v) end
	return "{" .. table.concat(items, ",") .. "}"
end

-- Send one request to the daemon; return Slurm's (rc, message).
-- `wait` hooks may block until data is staged: Slurm's own timeout bounds them.
local function call(op, fields, timeout)
	fields.v, fields.op = 1, op
	local zmtp = module("zmtp")
	local reply, kind, err = zmtp.request(site.socket, { json(fields) },
		{ timeout = timeout or 300 })
	if not reply then
		slurm.log_error("bbstage: %s job %s: %s (%s)", op, tostring(fields.job_id), err, kind)
		return slurm.ERROR, err
	end
	local status, message = reply[1], reply[2] or ""
	if status == "ok" then return slurm.SUCCESS, message end
	if status == "busy" then return slurm.SUCCESS, "BUSY" end
	return slurm.ERROR, message
end

-- A request for a hook that gets (job_id, job_script[, uid, gid, job_info]).
local function job_request(job_id, job_script, uid, gid, job_info)
	local fields = { job_id = job_id, uid = uid, gid = gid }
	if job_script then
		local text, err = read_script(job_script)
		if not text then return nil, err end
		fields.script = header(text)
	end
	if type(job_info) == "userdata" or type(job_info) == "table" then
		fields.nodes = job_info.nodes
		fields.work_dir = job_info.work_dir
	end
	return fields
end

local function forward(op, timeout, job_id, job_script, uid, gid, job_info, extra)
	local fields, err = job_request(job_id, job_script, uid, gid, job_info)
	if not fields then return slurm.ERROR, err end
	for k, v in pairs(extra or {}) do fields[k] = v end
	return call(op, fields, timeout)
end

local STAGE_TIMEOUT = 7 * 86400 -- Slurm's StageIn/OutTimeout kills the hook first

--[[ Synchronous hooks: parse only. ]]

-- At submission: reject a bad #BB_LUA directive with the line and what to fix.
function slurm_bb_job_process(job_script, uid, gid, job_info)
	local text, err = read_script(job_script)
	if not text then return slurm.ERROR, err end
	local result = module("directives").parse(text)
	if #result.errors > 0 then
		local messages = {}
		for i = 1, math.min(#result.errors, 3) do messages[i] = result.errors[i].message end
		return slurm.ERROR, table.concat(messages, "; ")
	end
	return slurm.SUCCESS
end

-- The pools Slurm accounts for (capacity= pool=), from bbstage_site.lua.
function slurm_bb_pools()
	local items = {}
	for i, p in ipairs(site.pools or {}) do
		items[i] = string.format('{"id":%s,"quantity":%d,"granularity":%d}',
			json(p.name), p.quantity, p.granularity)
	end
	return slurm.SUCCESS, '{"pools":[' .. table.concat(items, ",") .. "]}"
end

-- Environment for the job: BB_SCRATCH, the job's own scratch directory.
function slurm_bb_paths(job_id, job_script, path_file, uid, gid, job_info)
	local pools = site.pools or {}
	if #pools == 0 then return slurm.SUCCESS end
	local chosen = pools[1]
	local text = read_script(job_script)
	if text then
		local wanted = module("directives").parse(header(text)).pool
		for _, p in ipairs(pools) do
			if p.name == wanted then chosen = p end
		end
	end
	local f, err = io.open(path_file, "a")
	if not f then return slurm.ERROR, "cannot write path file: " .. tostring(err) end
	f:write("BB_SCRATCH=", chosen.root, "/", job_id, "\n")
	f:close()
	return slurm.SUCCESS
end

--[[ Asynchronous hooks: one request to the daemon each. ]]

-- Create the job's record and scratch space (22.05 gives uid and gid only here).
function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script, job_info)
	return forward("setup", 300, job_id, job_script, uid, gid, job_info,
		{ pool = pool, size = bb_size })
end

-- Stage in. 22.05: block until staged. 24.05+ (uid given): start, then test_data_in polls.
function slurm_bb_data_in(job_id, job_script, uid, gid, job_info)
	return forward("data_in", STAGE_TIMEOUT, job_id, job_script, uid, gid, job_info,
		{ wait = uid == nil })
end

function slurm_bb_test_data_in(job_id, job_script, uid, gid, job_info)
	return forward("test_data_in", 60, job_id, nil, uid, gid, job_info)
end

function slurm_bb_real_size(job_id, uid, gid, job_info)
	return forward("real_size", 60, job_id, nil, uid, gid, job_info)
end

function slurm_bb_pre_run(job_id, job_script, uid, gid, job_info)
	return forward("pre_run", 60, job_id, nil, uid, gid, job_info)
end

function slurm_bb_post_run(job_id, job_script, uid, gid, job_info)
	return forward("post_run", 60, job_id, nil, uid, gid, job_info)
end

-- Stage out: like data_in.
function slurm_bb_data_out(job_id, job_script, uid, gid, job_info)
	return forward("data_out", STAGE_TIMEOUT, job_id, job_script, uid, gid, job_info,
		{ wait = uid == nil })
end

function slurm_bb_test_data_out(job_id, job_script, uid, gid, job_info)
	return forward("test_data_out", 60, job_id, nil, uid, gid, job_info)
end

-- After the job, or on cancel (hurry "true": abort transfers now). Removes scratch.
function slurm_bb_job_teardown(job_id, job_script, hurry, uid, gid)
	return forward("teardown", 300, job_id, nil, uid, gid, nil,
		{ hurry = hurry == "true" or hurry == true })
end

-- `scontrol show bbstat [JOBID]`. 24.05+ passes the caller's uid and gid first.
function slurm_bb_get_status(...)
	local args, uid = { ... }, nil
	-- Heuristic: two leading numbers are (uid, gid); 22.05 passes only the user's args.
	if #args >= 2 and tostring(args[1]):match("^%d+$") and tostring(args[2]):match("^%d+$") then
		uid = table.remove(args, 1)
		table.remove(args, 1)
	end
	for i, v in ipairs(args) do args[i] = tostring(v) end
	return call("get_status", { args = args, uid = uid }, 30)
end
