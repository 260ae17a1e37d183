--[[
bbstage/hooks.lua: the asynchronous side of burst_buffer.lua. A hook sends one request to
the bbstage daemon (docs/protocol.md) over zmtp.lua and returns Slurm's (rc, message).
Only asynchronous hooks load this file, so job_process stays cheap to compile.
--]]

local M = {}

-- data_in/data_out may wait until staged: Slurm's StageIn/StageOutTimeout bounds them.
local STAGE_TIMEOUT = 7 * 86400
-- A daemon that restarts is back within this many seconds; one that is not running is
-- reported after it ("staging daemon not reachable").
local CONNECT_GRACE = 3

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

-- Send one request with the zmtp module; map the reply to Slurm's (rc, message).
-- When the daemon gave no answer, a third value is zmtp's failure kind.
function M.call(zmtp, socket_path, op, fields, timeout)
	fields.v, fields.op = 1, op
	local reply, kind, err = zmtp.request(socket_path, { json(fields) }, { timeout = timeout,
		connect_grace = CONNECT_GRACE })
	if not reply then
		slurm.log_error("bbstage: %s job %s: %s (%s)", op, tostring(fields.job_id), err, kind)
		return slurm.ERROR, err, kind
	end
	local status, message = reply[1], reply[2] or ""
	if status == "ok" then return slurm.SUCCESS, message end
	if status == "busy" then return slurm.SUCCESS, "BUSY" end
	return slurm.ERROR, message
end

-- A hook's request: job id, owner where Slurm gives it, the script, job_info fields.
function M.forward(zmtp, socket_path, op, timeout, job_id, script, uid, gid, job_info,
		extra)
	local fields = { job_id = job_id, uid = uid, gid = gid, script = script }
	if job_info ~= nil then
		fields.nodes, fields.work_dir = job_info.nodes, job_info.work_dir
	end
	for k, v in pairs(extra or {}) do fields[k] = v end
	return M.call(zmtp, socket_path, op, fields, timeout or STAGE_TIMEOUT)
end

return M
