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
-- After an "again", the daemon may be stopped for its upgrade: asked for this long.
local AGAIN_GAP = 120

local byte, find, format, gsub, sub = string.byte, string.find, string.format, string.gsub,
	string.sub

-- The UTF-8 rule of the directive grammar (RFC 3629, as Python's strict decoder).
-- burst_buffer.lua passes its module loader; require serves the standalone tests.
local load_module = type((...)) == "function" and (...) or function(name)
	return require("bbstage." .. name)
end
local utf8_len = load_module("directives").utf8_len

-- JSON escapes: control characters, quote and backslash; bytes >= 0x80 that are not UTF-8.
local CTRL = { ['"'] = "\\u0022", ["\\"] = "\\u005c", ["\127"] = "\\u007f" }
for c = 0, 31 do CTRL[string.char(c)] = format("\\u%04x", c) end
local HIGH = setmetatable({}, { __index = function(t, c) -- filled on first use
	local e = format("\\udc%02x", byte(c))
	t[c] = e
	return e
end })

-- A run of bytes >= 0x80: valid UTF-8 sequences as they are, every other byte as the
-- escape \udcXX (Python's surrogateescape; docs/protocol.md "Bytes").
local function escape_high(run)
	local n = #run
	if n == 1 then return HIGH[run] end -- one byte >= 0x80 alone (Latin-1 text) is never UTF-8
	local out, i, done = {}, 1, 1 -- run[done..i-1] is valid UTF-8 not yet copied
	while i <= n do
		local len = utf8_len(run, i)
		if len then
			i = i + len
		else
			out[#out + 1] = sub(run, done, i - 1)
			out[#out + 1] = HIGH[sub(run, i, i)]
			i = i + 1
			done = i
		end
	end
	out[#out + 1] = sub(run, done)
	return table.concat(out)
end

-- A Lua string (any bytes) as a JSON string that is valid UTF-8 (docs/protocol.md "Bytes").
local function json_string(s)
	s = gsub(s, '[%z\1-\31\127"\\]', CTRL) -- not %c: it follows the C locale
	if find(s, "[\128-\255]") then s = gsub(s, "[\128-\255]+", escape_high) end
	return '"' .. s .. '"'
end

-- Minimal JSON encoding for the flat request objects of docs/protocol.md.
local function json(value)
	local t = type(value)
	if t == "string" then
		return json_string(value)
	elseif t == "number" and value == math.floor(value) and value > -2 ^ 53 and value < 2 ^ 53 then
		return format("%d", value) -- Lua 5.3+ would write a float Slurm passed as "123.0"
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
M.json = json

-- A drained daemon leaves <dir of the socket>/staged/.drained until the next one starts
-- (bbstage/daemon/drain.py): a hook that finds no daemon then waits for the next one.
local function drained(socket_path)
	local f = io.open((socket_path:match("^(.*)/") or ".") .. "/staged/.drained")
	if f then f:close() end
	return f ~= nil
end

-- Send one request with the zmtp module; map the reply to Slurm's (rc, message).
-- When the daemon gave no answer, a third value is zmtp's failure kind. "again" (a daemon
-- draining for an upgrade: docs/protocol.md) is asked again, within the hook's timeout,
-- through the gap until the next daemon answers.
function M.call(zmtp, socket_path, op, fields, timeout)
	fields.v, fields.op = 1, op
	local request, socket = { json(fields) }, require("socket")
	local deadline, pause, asked = socket.gettime() + timeout, 0.5, drained(socket_path)
	local reply, kind, err
	while true do
		reply, kind, err = zmtp.request(socket_path, request, {
			timeout = math.max(deadline - socket.gettime(), 0.001),
			connect_grace = asked and AGAIN_GAP or CONNECT_GRACE })
		if not (reply and reply[1] == "again") then break end
		if not asked then
			slurm.log_info("bbstage: %s job %s: %s", op, tostring(fields.job_id), reply[2] or "")
			asked = true
		end
		if socket.gettime() + pause >= deadline then
			reply, kind, err = nil, "timeout", ("%s; still so after %g s"):format(reply[2], timeout)
			break
		end
		socket.sleep(pause)
		pause = math.min(pause * 2, 5)
	end
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
		-- Fair share stages a user's jobs expected to start first first (0: no estimate).
		fields.start_time, fields.priority = job_info.start_time, job_info.priority
	end
	for k, v in pairs(extra or {}) do fields[k] = v end
	return M.call(zmtp, socket_path, op, fields, timeout or STAGE_TIMEOUT)
end

return M
