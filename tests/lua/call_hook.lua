-- Call one hook of an installed burst_buffer.lua the way Slurm does, outside Slurm.
-- usage: lua5.N call_hook.lua <dir with burst_buffer.lua> <hook name> [args...]
-- Prints "rc=<rc>" then the message. The `slurm` table is a stand-in for Slurm's.
-- An argument "job_info:k=v,k=v" is passed as a job_info table (numbers where v is one).
slurm = {
	SUCCESS = 0, ERROR = -1,
	log_info = function() end, log_debug = function() end,
	log_error = function(fmt, ...) io.stderr:write(string.format(fmt, ...), "\n") end,
}
local dir, hook = arg[1], arg[2]
-- 24.05+ defines slurm.SLURM_BB_BUSY (burst_buffer.lua tells the generations apart by it) and
-- passes uid after (job_id, script): a call with a uid there stands for 24.05+.
if hook ~= "slurm_bb_setup" and hook ~= "slurm_bb_get_status" and arg[5] ~= nil and arg[5] ~= "nil" then
	slurm.SLURM_BB_BUSY = "BUSY"
end
dofile(dir .. "/burst_buffer.lua")
local args = {}
for i = 3, #arg do
	local v = arg[i]
	if v == "nil" then v = nil end
	if v and v:sub(1, 9) == "job_info:" then
		local t = {}
		for k, x in v:sub(10):gmatch("([%w_]+)=([^,]*)") do t[k] = tonumber(x) or x end
		v = t
	end
	args[i - 2] = v
end
local rc, message = _G[hook]((table.unpack or unpack)(args, 1, #arg - 2))
io.write("rc=", tostring(rc), "\n", tostring(message or ""), "\n")
