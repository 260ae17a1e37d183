-- lua5.1 bench_job_process.lua <parser> <hook.lua> <script> <iterations> <batches>
-- Times, in one lua5.1 process, what slurmctld pays per slurm_bb_job_process call:
--   total:  compile <hook.lua> (Slurm loads burst_buffer.lua into a fresh state on every
--           call; compiled only, running it needs slurmctld's `slurm` table) + load <parser>
--           (source: compile; a luac file: undump) and run it in a fresh environment +
--           read <script> from disk + parse it;
--   module: load <parser> in a fresh environment + parse (the parser's own share);
--   load:   load <parser> only;  parse: parse only (module already loaded).
-- Each figure is the median over <batches> of the mean over <iterations> calls (os.clock).
-- Prints one JSON object.
local parser_file, hook_file, script_file = arg[1], arg[2], arg[3]
local iterations, batches = tonumber(arg[4]) or 200, tonumber(arg[5]) or 31

local function read(path)
	local f = assert(io.open(path, "rb"))
	local text = f:read("*a")
	f:close()
	return text
end

local function load_parser()
	local chunk = assert(loadfile(parser_file))
	setfenv(chunk, setmetatable({}, { __index = _G }))
	return chunk()
end

local text = read(script_file)

local function total()
	assert(loadfile(hook_file))
	return load_parser().parse(read(script_file))
end

local function module_only() return load_parser().parse(text) end
local function load_only() return load_parser() end
local M = load_parser()
local function parse_only() return M.parse(text) end

local function median(xs)
	table.sort(xs)
	return xs[math.floor((#xs + 1) / 2)]
end

local function timed(fn)
	local samples = {}
	for b = 1, batches do
		collectgarbage("collect")
		local t0 = os.clock()
		for _ = 1, iterations do fn() end
		samples[b] = (os.clock() - t0) * 1000 / iterations
	end
	return median(samples)
end

local result = total()
io.write(string.format(
	'{"total_ms":%.6f,"module_ms":%.6f,"load_ms":%.6f,"parse_ms":%.6f,'
		.. '"directives":%d,"errors":%d,"bytes":%d}\n',
	timed(total), timed(module_only), timed(load_only), timed(parse_only),
	#result.directives, #result.errors, #text))
