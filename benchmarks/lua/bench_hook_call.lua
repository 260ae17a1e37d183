-- lua5.N bench_hook_call.lua <installed dir> <minimal hook file> <script> <iterations> <batches>
-- What slurmctld pays per slurm_bb_job_process call, as Slurm calls it: compile
-- burst_buffer.lua, run it (it defines the hooks), call slurm_bb_job_process(<script>).
--   hook:    <installed dir>/burst_buffer.lua, as `bbstage install-lua` installed it;
--   minimal: <minimal hook file> (benchmarks/lua/minimal_job_process.lua).
-- Not timed, the same for both: Slurm's fresh Lua state (luaL_newstate, openlibs, its
-- `slurm` table). Each figure is the median over <batches> of the mean over <iterations>
-- calls (os.clock); the two alternate which runs first from batch to batch. Prints JSON.
local dir, minimal, script = arg[1], arg[2], arg[3]
local iterations, batches = tonumber(arg[4]) or 200, tonumber(arg[5]) or 31
local function nothing() end
slurm = {
	SUCCESS = 0, ERROR = -1, log_info = nothing, log_debug = nothing, log_verbose = nothing,
	-- e.g. bytecode of another Lua: the figures would be those of the fallback
	log_error = function(fmt, ...) error("the hook logged an error: " .. fmt:format(...)) end,
}
local files = { hook = dir .. "/burst_buffer.lua", minimal = minimal }

local function call(file)
	assert(loadfile(file))()
	local rc, message = slurm_bb_job_process(script, "1000", "1000", {})
	if rc ~= slurm.SUCCESS then error(file .. ": " .. tostring(message)) end
end

local function median(xs)
	table.sort(xs)
	return xs[math.floor((#xs + 1) / 2)]
end

local samples = { hook = {}, minimal = {} }
for b = 1, batches do
	local order = b % 2 == 1 and { "hook", "minimal" } or { "minimal", "hook" }
	for _, name in ipairs(order) do
		local file = files[name]
		call(file)
		collectgarbage("collect")
		local t0 = os.clock()
		for _ = 1, iterations do call(file) end
		samples[name][b] = (os.clock() - t0) * 1000 / iterations
	end
end
io.write(string.format('{"lua":"%s","hook_ms":%.6f,"minimal_ms":%.6f}\n', _VERSION,
	median(samples.hook), median(samples.minimal)))
