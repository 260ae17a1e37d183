-- Baseline for bench_job_process.py: the line-by-line string.find/match style of Slurm's
-- burst_buffer.lua.example (our own code, written for comparison, not Slurm's).
-- Walks every line of the script with string.gmatch (no header stop, no quoting, no checks).
local M = {}

function M.parse(text)
	local directives, pool, capacity = {}, nil, nil
	for line in string.gmatch(text, "[^\n]+") do
		if string.find(line, "^#BB_LUA") then
			local verb = string.match(line, "^#BB_LUA%s+(%S+)")
			if verb == "stage_in" or verb == "stage_out" then
				local source = string.match(line, "source=(%S+)")
				local destination = string.match(line, "destination=(%S+)")
				if source and destination then
					directives[#directives + 1] = {
						verb = verb, source = source, destination = destination,
					}
				end
			end
			pool = string.match(line, "pool=(%S+)") or pool
			capacity = string.match(line, "capacity=(%S+)") or capacity
		end
	end
	return { directives = directives, pool = pool, capacity = capacity, errors = {} }
end

return M
