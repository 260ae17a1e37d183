-- #BB_LUA and #DW (DataWarp, NNF) directive parser for slurm_bb_job_process (grammar: docs/directives.md).
-- Mirrors bbstage/directives.py check for check; tests/corpus keeps the two in step.
-- Lua 5.1 to 5.4, string functions only, linear time, stops at the end of the script header.
-- slurmctld compiles this on every submission: keep it short (messages live in one string).
local M = {}
local _, site = ... -- burst_buffer.lua's module loader passes bbstage_site.lua's table
local find, sub, byte, match, upper, lower, format = string.find, string.sub, string.byte, string.match,
	string.upper, string.lower, string.format
local gsub, unpack, error, pcall, type, tonumber = string.gsub, table.unpack or unpack, error, pcall, type,
	tonumber
local ipairs, pairs, select, tostring = ipairs, pairs, select, tostring

-- The grammar's tables, by their names in bbstage/directives.py: bbstage_site.lua's `grammar`,
-- written from there by `bbstage install-lua`; without it these, the same (tests/test_grammar.py).
-- Capacity units are floats (2 ^ 10), the bare unit 1 alone an integer: Lua 5.3+ never overflows.
local G = type(site) == "table" and site.grammar
if not G then
	G = { MAX_SCRIPT_BYTES = 4194304, MAX_LINE_BYTES = 4096, MAX_DIRECTIVES = 256, MAX_ERRORS = 20,
		MAX_HEADER_LINES = 65536, MAX_CAPACITY = 2 ^ 53, VERBS = { stage_in = 1, stage_out = 1 },
		STAGE_KEYS = { source = 1, destination = 1, checksum = 1, overwrite = 1, profile = 1 },
		OPTION_VALUES = { checksum = { none = 1, xxh3 = 1, blake2b = 1 }, overwrite = { always = 1, never = 1, newer = 1 } },
		OPTION_HINTS = { checksum = "none, xxh3 or blake2b", overwrite = "always, never or newer" },
		UNITS = { [""] = 1, K = 2 ^ 10, M = 2 ^ 20, G = 2 ^ 30, T = 2 ^ 40, P = 2 ^ 50 },
		-- #DW: verbs that stage (NNF's copy_in is DataWarp's stage_in), their keys, refused verbs,
		-- jobdw's keys and values; capacity units as Slurm's suffix_mult ("GB" 10^9, "G" "GiB" 2^30)
		DW_UNITS = {},
		DW_VERBS = { stage_in = "stage_in", stage_out = "stage_out", copy_in = "stage_in", copy_out = "stage_out" },
		DW_STAGE_KEYS = { stage_in = { source = 1, destination = 1, type = 1 }, copy_in = { source = 1, destination = 1 } },
		DW_REFUSED = { persistentdw = "persistent", create_persistent = "persistent", destroy_persistent = "persistent",
			swap = "swap", container = "container" },
		JOBDW_KEYS = { capacity = 1, pool = 1, type = 1, access_mode = 1, name = 1 },
		JOBDW_TYPES = { scratch = 1, xfs = 1, gfs2 = 1, lustre = 1 },
		ACCESS_MODES = { striped = 1, private = 1, ["striped,private"] = 1, ["private,striped"] = 1 },
		DW_SCRATCH_VARS = { "DW_JOB_STRIPED", "DW_JOB_PRIVATE" } }
	local k = G.DW_STAGE_KEYS
	k.stage_out, k.copy_out = k.stage_in, k.copy_in
	for u, v in pairs(G.UNITS) do G.DW_UNITS[u] = v end
	for e, u in ipairs({ "K", "M", "G", "T", "P" }) do G.DW_UNITS[u .. "IB"], G.DW_UNITS[u .. "B"] = 2 ^ (10 * e), 10 ^ (3 * e) end
end
M.GRAMMAR = G
M.MAX_SCRIPT_BYTES, M.MAX_LINE_BYTES, M.MAX_DIRECTIVES = G.MAX_SCRIPT_BYTES, G.MAX_LINE_BYTES, G.MAX_DIRECTIVES
M.MAX_ERRORS, M.MAX_HEADER_LINES = G.MAX_ERRORS, G.MAX_HEADER_LINES
local MAX_LINE, MAX_HEADER, MAX_CAPACITY = G.MAX_LINE_BYTES, G.MAX_HEADER_LINES, G.MAX_CAPACITY
local UNITS, DW_UNITS, VERBS, STAGE_KEYS, VALUES, HINTS = G.UNITS, G.DW_UNITS, G.VERBS, G.STAGE_KEYS,
	G.OPTION_VALUES, G.OPTION_HINTS
local DW_VERBS, DW_STAGE_KEYS, DW_REFUSED, JOBDW_KEYS = G.DW_VERBS, G.DW_STAGE_KEYS, G.DW_REFUSED, G.JOBDW_KEYS
local JOBDW_TYPES, ACCESS_MODES, DW_SCRATCH_VARS = G.JOBDW_TYPES, G.ACCESS_MODES, G.DW_SCRATCH_VARS
-- The URL schemes of the enabled backends, in order, with their rules: bbstage_site.lua's
-- `schemes`, written by `bbstage install-lua` from the config's registry (Registry.url_rules),
-- as bbstage/directives.py checks them; S3 alone without it.
local SCHEMES = type(site) == "table" and site.schemes or { { scheme = "s3", what = "S3 bucket",
	rules = "bucket names have 3-63 characters a-z 0-9 . - and start and end with a letter or digit",
	one = "^[a-z0-9]$", many = "^[a-z0-9][a-z0-9%.%-]*[a-z0-9]$", low = 3, high = 63, utf8 = true, profile = true } }
local BY_SCHEME, EXAMPLES, TAKERS = {}, {}, {}
for i, r in ipairs(SCHEMES) do
	BY_SCHEME[r.scheme], EXAMPLES[i] = r, r.scheme .. "://" .. match(r.what, "(%S+)$") .. "/key"
	if r.profile then TAKERS[#TAKERS + 1] = r.scheme .. "://" end
end
EXAMPLES = #EXAMPLES > 0 and table.concat(EXAMPLES, ", ") or "nothing else"
TAKERS = table.concat(TAKERS, " and ")
-- "key<TAB>template": the code is the key up to "/"; identical to MESSAGES in directives.py.
local MSGS = [[

script-too-large	script: %d bytes is over the %d byte limit: shorten the script
too-many-directives	more than %d directive lines: stage a directory tree or a wildcard instead of single files
header-too-long	the script header (the lines before the first command) is over %d lines: move comments below the first command
line-too-long	directive line is %d bytes, over the %d byte limit: shorten the paths or stage a directory
crlf	line ends with a carriage return (DOS line ending): convert the script with dos2unix
control-char	control character 0x%02x in directive: remove it
continuation	line ends with "\": continuation lines are not supported: put the whole directive on one line
missing-value/sbatch	#SBATCH --bb has no value: write #SBATCH --bb="#BB_LUA ..."
bad-bb-option	#SBATCH --bb value must start with #BB_LUA or #DW (Slurm inserts it into the script as a line): write #SBATCH --bb="#BB_LUA ..."
bad-token/key	"=" without a key: write key=value
unterminated-quote	unterminated quote in value of "%s": add the closing "
bad-escape	bad escape in quoted value of "%s": only \" and \\ are allowed inside quotes
bad-quote/after	text after the closing quote in value of "%s": put a space after the closing "
bad-quote/stray	stray quote in value of "%s": quote the whole value, e.g. %s="/a b/c"
bad-token	"%s" is not key=value: write key=value
unknown-verb	unknown verb "%s": use stage_in or stage_out (or pool=NAME capacity=SIZE on a line of its own)
unknown-key	unknown key "%s": use source, destination, checksum, overwrite or profile
unknown-key/pool	pool= and capacity= go on a #BB_LUA line of their own
unknown-key/verbless	unknown key "%s" on a line without a verb: start the line with stage_in or stage_out, or use only pool= and capacity=
duplicate-key	"%s" given twice: keep one
empty-value	empty value for "%s": give a value
missing-value	missing %s=: add %s=<location>
unknown-variable	"%s" in %s: only a leading $BB_SCRATCH, $DW_JOB_STRIPED, $DW_JOB_PRIVATE or $DW_JOB_<name of a #DW jobdw above> is expanded (use %%u for the user name, %%j for the job id)
bad-scheme	unsupported scheme in %s "%s": use an absolute path, $BB_SCRATCH/..., or %s
bad-bucket/key	%s "%s" has no key part: write %s/ for a whole %s or %s/key
bad-bucket	bad %s in %s "%s": %s
host-not-allowed	host %s in %s "%s" is not allowed on this site: the administrator may add "%s" to %s in the daemon config
non-utf8	byte 0x%02x in %s "%s" is not UTF-8 and %s keys are UTF-8 text: save the script as UTF-8 (iconv -f LATIN1 -t UTF-8) or rename the key
relative-path	relative path "%s" in %s: use an absolute path, $BB_SCRATCH/..., or %s
dot-dot	".." component in %s "%s": write the path without ..
bad-glob	wildcard in %s "%s": wildcards are only allowed in a stage_in source
bad-glob/tree	wildcard source "%s" ends with /: drop the / or the wildcard
bad-glob/first	wildcard in the first directory of source "%s": start with a literal directory, e.g. /data/...
bad-glob/bracket	unclosed [ in source "%s": close it with ]
bad-glob/dest	destination "%s" of a wildcard source must be a directory ending in /: add the /
tree-mismatch	source "%s" and destination "%s" must both be directories (ending in /) or both files
bad-option-value	%s="%s" is not allowed: use %s
bad-option-value/profile	profile="%s" is not a valid profile name: use 1-64 characters A-Z a-z 0-9 _ . -
bad-option-value/pool	pool="%s" is not a valid pool name: use 1-64 characters A-Z a-z 0-9 _ . -
profile-without-s3	profile= applies only to %s locations: remove it
capacity-in-value	"capacity=" inside a value would be read by Slurm as a capacity request: rename the path
duplicate-destination	destination "%s" is also written by line %d: give each directive its own destination
bad-quote/pool	value of "%s" must not be quoted (Slurm reads pool= and capacity= verbatim)
capacity-without-pool	capacity= needs pool=: write pool=NAME capacity=SIZE
bad-size	bad capacity "%s": use a whole number of bytes with an optional K, M, G, T or P suffix (binary units), above 0 and below 8P
duplicate-pool	pool=/capacity= already given on line %d: use one line
unknown-verb/dw	unknown #DW verb "%s": use jobdw, stage_in, stage_out, copy_in or copy_out (or a #BB_LUA line)
unknown-key/dw	unknown key "%s" on a #DW %s line: use %s
missing-value/type	missing type=: add type=file or type=directory
tree-mismatch/file	type=file but "%s" is a directory: drop the / or write type=directory
dw-unsupported/persistent	#DW %s: persistent burst buffers do not exist with bbstage: stage the data from the shared file system in each job (#DW stage_in, #DW copy_in or #BB_LUA stage_in)
dw-unsupported/swap	#DW %s: bbstage gives no swap space: remove the line
dw-unsupported/container	#DW %s: bbstage runs no containers on storage nodes: remove the line
dw-unsupported/list	type=list would read the list file at submission, which bbstage does not do: write one #DW %s line per file (type=file), or stage their directory (type=directory)
dw-unsupported/cache	type=cache (DataWarp cache mode) is not available: use type=scratch and stage the files with #DW stage_in and stage_out
dw-unsupported/raw	type=raw is a block device and bbstage gives a directory: use type=xfs
dw-unsupported/profile	profile= on a #DW line names an NNF profile, which bbstage has not: remove it
dw-unsupported/requires	requires= (NNF daemons) is not available: remove it
capacity-without-pool/dw	capacity= needs pool= (Slurm's burst_buffer/lua rejects the job without it): add pool=NAME to the #DW jobdw line
bad-size/dw	bad capacity "%s": use a whole number with an optional unit K, M, G, T, P or KiB ... PiB (powers of 1024), or KB ... PB (powers of 1000), above 0 and below 8 PiB
bad-option-value/name	name="%s" is not a valid jobdw name: use 1-64 characters A-Z a-z 0-9 _ -
duplicate-pool/jobdw	a job has one scratch space and line %d already asks for it: use one #DW jobdw (or one pool= line)
late-directive	%s line after the first command (line %d) is ignored by Slurm: move it above line %d
late-directive/indented	indented %s line is a command for Slurm and ends the script header: remove the indentation
internal-error	%s
]]

local function fail(...) error({ ... }, 0) end

local function err(line, ctx, key, ...)
	local _, e = find(MSGS, "\n" .. key .. "\t", 1, true)
	local msg = format(sub(MSGS, e + 1, find(MSGS, "\n", e + 1, true) - 1), ...)
	return { line = line, code = match(key, "^[^/]*"), message = ctx .. msg }
end

local function strip(s)
	local a, e = find(s, "[^ \t]"), #s
	if not a then return "" end
	while byte(s, e) == 32 or byte(s, e) == 9 do e = e - 1 end
	return sub(s, a, e)
end

local function is_name(s) return #s <= 64 and find(s, "^[A-Za-z0-9_%.%-]+$") end

-- "#BB_LUA" or "#DW" if s has it at i and then a space, a tab, a newline or its end.
local function prefix(s, i)
	local p = sub(s, i, i + 2) == "#DW" and "#DW" or sub(s, i, i + 6) == "#BB_LUA" and "#BB_LUA"
	local c = p and byte(s, i + #p)
	if p and (not c or c == 32 or c == 9 or c == 10) then return p end
end

-- Spec of "#SBATCH --bb", then its prefix (#BB_LUA or #DW) and content (or nil, nil).
local function sbatch_content(raw)
	local _, e = find(raw, "^#SBATCH[ \t]+%-%-bb=?")
	local spec = strip(sub(raw, e + 1))
	if #spec > 1 and byte(spec) == 34 and byte(spec, -1) == 34 then spec = sub(spec, 2, -2) end
	local p = prefix(spec, 1)
	if p then return spec, p, strip(sub(spec, #p + 1)) end
	return spec
end

-- "#SBATCH --bb" (then =, a space, a tab, a newline or the end) at s[i]?
local function sbatch_at(s, i)
	local _, e = find(s, "^#SBATCH[ \t]+%-%-bb", i)
	local c = e and byte(s, e + 1)
	return e and (not c or c == 61 or c == 32 or c == 9 or c == 10)
end

-- Directive lines of the header ({n, raw, kind}: bb, dw or sbatch), whether one is an
-- #SBATCH --bb line, and the first command's line number and offset (nil if none).
local function header(text)
	local out, sbatch, pos, n, len = {}, false, 1, 0, #text
	while pos <= len do
		n = n + 1
		local e = find(text, "\n", pos, true) or len + 1
		local c = byte(text, pos)
		if c ~= 35 and e ~= pos then return out, sbatch, n, pos end
		if n > MAX_HEADER then out[#out + 1] = { n }; break end
		c = byte(text, pos + 1) -- after "#": D, B or S, else a comment
		if c == 68 or c == 66 then
			local p = prefix(text, pos)
			if p then out[#out + 1] = { n, sub(text, pos, e - 1), p == "#DW" and "dw" or "bb" } end
		elseif c == 83 and sbatch_at(text, pos) then
			out[#out + 1] = { n, sub(text, pos, e - 1), "sbatch" }
			sbatch = true
		end
		pos = e + 1
	end
	return out, sbatch
end

-- The set of "prefix content" of the header's #BB_LUA and #DW lines (an #SBATCH --bb line
-- that repeats one is Slurm's copy of it: docs/directives.md).
local function contents(lines)
	local seen = {}
	for _, l in ipairs(lines) do
		local raw, kind = l[2], l[3]
		if raw and kind ~= "sbatch" and #raw <= MAX_LINE then
			local p = kind == "dw" and "#DW" or "#BB_LUA"
			seen[p .. " " .. strip(sub(raw, #p + 1))] = true
		end
	end
	return seen
end

-- Staging lines at or after the first command (line first, offset pos), as warnings. Plain
-- searches for each prefix: a pattern is tried at every byte, ms for a 1 MiB body.
local function late(text, first, pos)
	local hits = {}
	for _, needle in ipairs({ "#BB_LUA", "#DW", "#SBATCH" }) do
		local i, n = find(text, needle, pos, true), 0
		while i and n < M.MAX_ERRORS do -- the first MAX_ERRORS of each are enough
			local k = i - 1
			while k >= pos and (byte(text, k) == 32 or byte(text, k) == 9) do k = k - 1 end
			if (k < pos or byte(text, k) == 10) and (prefix(text, i) or sbatch_at(text, i)) then
				n = n + 1
				hits[#hits + 1] = { k + 1, i }
			end
			i = find(text, needle, i + 1, true)
		end
	end
	table.sort(hits, function(a, b) return a[2] < b[2] end)
	local out, line, at = {}, first, pos
	for _, hit in ipairs(hits) do
		local ls, h = hit[1], hit[2]
		local p = prefix(text, h) or "#SBATCH --bb"
		line = line + select(2, gsub(sub(text, at, ls - 1), "\n", ""))
		at = ls
		if line == first and h > ls then
			out[#out + 1] = err(line, "line " .. line .. ": ", "late-directive/indented", p)
		else
			out[#out + 1] = err(line, "line " .. line .. ": ", "late-directive", p, first, first)
		end
		if #out >= M.MAX_ERRORS then break end
	end
	return out
end

-- Split content into parallel arrays keys (false for a bare word), values, quoted (true for a
-- quoted value, else nil: a table that stays empty costs no resizing).
-- One match per word: a pattern tried at every byte costs a call into the matcher per byte.
local function tokenize(s)
	local keys, vals, quoted, p, i = {}, {}, {}, 1, 0
	while true do
		local word, eq, q = match(s, "^[ \t]*([^ \t=]*)(=?)()", p)
		if eq == "" then
			if word == "" then return keys, vals, quoted end
			i = i + 1
			keys[i], vals[i], p = false, word, q
		else
			if word == "" then fail("bad-token/key") end
			i = i + 1
			keys[i] = word
			if byte(s, q) == 34 then
				local r, escaped, j, c = q + 1, false
				while true do
					j = match(s, '^[^"\\]*()', r)
					c = byte(s, j + 1)
					if j > #s or (byte(s, j) == 92 and not c) then fail("unterminated-quote", word) end
					if byte(s, j) == 34 then break end
					if c ~= 34 and c ~= 92 then fail("bad-escape", word) end
					r, escaped = j + 2, true
				end
				if c and c ~= 32 and c ~= 9 then fail("bad-quote/after", word) end
				vals[i], quoted[i] = sub(s, q + 1, j - 1), true
				if escaped then vals[i] = gsub(vals[i], "\\(.)", "%1") end
				p = j + 1
			else
				local v, r = match(s, '^([^ \t"]*)()', q)
				if byte(s, r) == 34 then fail("bad-quote/stray", word, word) end
				vals[i], p = v, r
			end
		end
	end
end

-- Length of the valid UTF-8 sequence that starts at s[i] (a byte >= 0x80), or nil. Valid is
-- RFC 3629, as Python's strict decoder: no overlong forms, surrogates or values > U+10FFFF.
-- (hooks.lua escapes by the same rule.)
local function utf8_len(s, i)
	local c, n, lo, hi = byte(s, i), 3, 0x80, 0xBF
	if c >= 0xC2 and c <= 0xDF then n = 2
	elseif c == 0xE0 then lo = 0xA0
	elseif c == 0xED then hi = 0x9F
	elseif c >= 0xE1 and c <= 0xEF then n = 3
	elseif c == 0xF0 then n, lo = 4, 0x90
	elseif c >= 0xF1 and c <= 0xF3 then n = 4
	elseif c == 0xF4 then n, hi = 4, 0x8F
	else return nil end
	local b = byte(s, i + 1)
	if not b or b < lo or b > hi then return nil end
	for k = i + 2, i + n - 1 do
		b = byte(s, k)
		if not b or b < 0x80 or b > 0xBF then return nil end
	end
	return n
end
M.utf8_len = utf8_len

-- The first byte of s that is not part of a valid UTF-8 sequence, or nil.
local function non_utf8(s)
	local i = find(s, "[\128-\255]")
	while i do
		local n = utf8_len(s, i)
		if not n then return byte(s, i) end
		i = find(s, "[\128-\255]", i + n)
	end
end

local function unclosed_bracket(path)
	local i, k = find(path, "[", 1, true), 0
	while i do
		if k and k <= i then k = find(path, "/", i + 1, true) end -- next "/" after i
		local j = find(path, "]", i + 1, true)
		if not j or (k and k < j) then return true end
		i = find(path, "[", j + 1, true)
	end
end

local function location(v, role, verb, st) -- kind, tree, glob, location ($DW_JOB_x/... as $BB_SCRATCH/...)
	local kind, path, c = "posix", v, byte(v)
	if c == 36 then
		local name, rest = match(v, "^%$([A-Za-z0-9_]+)(.*)$")
		if not name or (rest ~= "" and byte(rest) ~= 47) or (name ~= "BB_SCRATCH" and not st.dw_vars[name]) then
			fail("unknown-variable", v, role)
		end
		if name ~= "BB_SCRATCH" then st.dw, v = true, "$BB_SCRATCH" .. rest end
		kind, path = "scratch", rest
	elseif c ~= 47 then
		local scheme = match(v, "^([A-Za-z][A-Za-z0-9+%.%-]*)://")
		if not scheme then fail("relative-path", v, role, EXAMPLES) end
		local r = BY_SCHEME[scheme]
		if not r then fail("bad-scheme", role, v, EXAMPLES) end
		local start, word = #scheme + 4, match(r.what, "(%S+)$")
		local slash, top = find(v, "/", start, true), scheme .. "://" .. word
		if not slash then fail("bad-bucket/key", role, v, top, word, top) end
		local b = sub(v, start, slash - 1)
		if #b < r.low or #b > r.high or not (find(b, r.one) or find(b, r.many)) then
			fail("bad-bucket", r.what, role, v, r.rules)
		end
		if r.port then -- the site's allowed_hosts: [user@]host[:port] as "host:port", lower-case
			local hp = lower(match(b, "[^@]*$"))
			local h, p = match(hp, "^(.*):0*(%d+)$")
			if not h then h, p = hp, r.port end
			local name = h .. ":" .. p
			if not r.hosts[name] then fail("host-not-allowed", name, role, v, name, r.key) end
		end
		kind, path = scheme, sub(v, slash)
		local bad = r.utf8 and non_utf8(v)
		if bad then fail("non-utf8", bad, role, v, match(r.what, "^(%S+)")) end
	end
	if find(path, "/../", 1, true) or sub(path, -3) == "/.." then fail("dot-dot", role, v) end
	if find(path, "$", 1, true) then fail("unknown-variable", v, role) end
	local tree = byte(v, -1) == 47 or v == "$BB_SCRATCH"
	local glob = (find(path, "*", 1, true) or find(path, "?", 1, true) or find(path, "[", 1, true)) ~= nil
	if glob then
		if role == "destination" or verb == "stage_out" then fail("bad-glob", role, v) end
		if tree then fail("bad-glob/tree", v) end
		if kind == "posix" and find(match(path, "^/([^/]*)"), "[%*%?%[]") then fail("bad-glob/first", v) end
		if unclosed_bracket(path) then fail("bad-glob/bracket", v) end
	end
	return kind, tree, glob, v
end

-- The key=value tokens after the verb, checked against the keys the form takes.
local function stage_options(written, keys, vals, dw)
	local allowed, kv = dw and DW_STAGE_KEYS[written] or STAGE_KEYS, {}
	for i = 2, #keys do
		local key, value = keys[i], vals[i]
		if not key then fail("bad-token", value) end
		if not allowed[key] then
			if dw then
				if key == "profile" and sub(written, 1, 4) == "copy" then fail("dw-unsupported/profile") end
				local hint = "source=, destination=" .. (allowed.type and " and type=" or "")
				fail("unknown-key/dw", key, written, hint .. " (other options: #BB_LUA)")
			end
			if key == "pool" or key == "capacity" then fail("unknown-key/pool") end
			fail("unknown-key", key)
		end
		if kv[key] then fail("duplicate-key", key) end
		if value == "" then fail("empty-value", key) end
		kv[key] = value
	end
	return kv
end

-- A stage line: #BB_LUA stage_in/out, #DW stage_in/out (DataWarp), #DW copy_in/out (NNF).
local function stage(st, n, written, keys, vals, dw)
	st.verb = written
	local verb, kv = DW_VERBS[written], stage_options(written, keys, vals, dw)
	local src, dst = kv.source, kv.destination
	if not src then fail("missing-value", "source", "source") end
	if not dst then fail("missing-value", "destination", "destination") end
	local kind = kv.type
	if dw and sub(written, 1, 5) == "stage" then
		if not kind then fail("missing-value/type") end
		if kind == "list" then fail("dw-unsupported/list", written) end
		if kind ~= "file" and kind ~= "directory" then fail("bad-option-value", "type", kind, "file or directory") end
		if kind == "directory" then -- a DataWarp directory is written without the final /
			if byte(src, -1) ~= 47 then src = src .. "/" end
			if byte(dst, -1) ~= 47 then dst = dst .. "/" end
		end
	end
	local skind, stree, sglob, dkind, dtree, _
	skind, stree, sglob, src = location(src, "source", verb, st)
	dkind, dtree, _, dst = location(dst, "destination", verb, st)
	if kind == "file" and (stree or dtree) then fail("tree-mismatch/file", stree and src or dst) end
	if sglob then
		if not dtree then fail("bad-glob/dest", dst) end
	elseif stree ~= dtree then
		fail("tree-mismatch", src, dst)
	end
	local options = { checksum = kv.checksum or "none", overwrite = kv.overwrite or "always" }
	if not VALUES.checksum[options.checksum] then fail("bad-option-value", "checksum", options.checksum, HINTS.checksum) end
	if not VALUES.overwrite[options.overwrite] then fail("bad-option-value", "overwrite", options.overwrite, HINTS.overwrite) end
	if kv.profile then
		if not is_name(kv.profile) then fail("bad-option-value/profile", kv.profile) end
		if not (BY_SCHEME[skind] or {}).profile and not (BY_SCHEME[dkind] or {}).profile then
			fail("profile-without-s3", TAKERS)
		end
		options.profile = kv.profile
	end
	for i = 2, #vals do
		if find(vals[i], "capacity=", 1, true) then fail("capacity-in-value") end
	end
	local e = #dst
	while byte(dst, e) == 47 do e = e - 1 end
	local norm = sub(dst, 1, e)
	if st.dests[norm] then fail("duplicate-destination", dst, st.dests[norm]) end
	st.dests[norm] = n
	local d = st.directives
	d[#d + 1] = { index = #d, line = n, verb = verb, source = src, destination = dst, source_kind = skind,
		destination_kind = dkind, tree = stree, glob = sglob, options = options }
end

-- Bytes of "digits[unit]" (unit case-insensitive), or nil if not a size we take.
local function size_of(cap, units)
	local d, u = match(cap, "^([0-9]+)([A-Za-z]*)$")
	local size = d and units[upper(u)] and tonumber(d) * units[upper(u)]
	if size and size > 0 and size < MAX_CAPACITY then return size end
end

-- #DW jobdw: the job's scratch space (DataWarp or NNF), as pool= capacity=.
local function jobdw(st, n, keys, vals, quoted)
	st.verb = "jobdw"
	local kv = {}
	for i = 2, #keys do
		local key, value = keys[i], vals[i]
		if not key then fail("bad-token", value) end
		if key == "profile" or key == "requires" then fail("dw-unsupported/" .. key) end
		if key == "pfs" then fail("dw-unsupported/cache") end -- DataWarp's cache mode: type=cache pfs=/path
		if not JOBDW_KEYS[key] then fail("unknown-key/dw", key, "jobdw", "capacity=, pool=, type=, access_mode=, name=") end
		if kv[key] then fail("duplicate-key", key) end
		if quoted[i] then fail("bad-quote/pool", key) end
		if value == "" then fail("empty-value", key) end
		kv[key] = value
	end
	local kind, mode, name = kv.type or "scratch", kv.access_mode or "striped", kv.name
	if kind == "cache" or kind == "raw" then fail("dw-unsupported/" .. kind) end
	if not JOBDW_TYPES[kind] then fail("bad-option-value", "type", kind, "scratch, xfs, gfs2 or lustre") end
	if not ACCESS_MODES[mode] then fail("bad-option-value", "access_mode", mode, "striped or private") end
	if name and (#name > 64 or not find(name, "^[A-Za-z0-9_%-]+$")) then fail("bad-option-value/name", name) end
	local pool, cap, size = kv.pool, kv.capacity
	if pool and not is_name(pool) then fail("bad-option-value/pool", pool) end
	if cap then
		if not pool then fail("capacity-without-pool/dw") end
		size = size_of(cap, DW_UNITS)
		if not size then fail("bad-size/dw", cap) end
	end
	if st.pool_line then fail("duplicate-pool/jobdw", st.pool_line) end
	st.pool_line, st.pool, st.capacity = n, pool, size
	if name then
		local var = "DW_JOB_" .. gsub(name, "%-", "_")
		if not st.dw_vars[var] then
			st.dw_vars[var] = true
			st.dw_names[#st.dw_names + 1] = var
		end
	end
end

local function pool_line(st, n, keys, vals, quoted)
	local kv = {}
	for i = 1, #keys do
		local key, value = keys[i], vals[i]
		if not key then fail("bad-token", value) end
		if key ~= "pool" and key ~= "capacity" then fail("unknown-key/verbless", key) end
		if kv[key] then fail("duplicate-key", key) end
		if quoted[i] then fail("bad-quote/pool", key) end
		if value == "" then fail("empty-value", key) end
		kv[key] = value
	end
	local pool, cap, size = kv.pool, kv.capacity
	if not pool then fail("capacity-without-pool") end
	if not is_name(pool) then fail("bad-option-value/pool", pool) end
	if cap then
		size = size_of(cap, UNITS)
		if not size then fail("bad-size", cap) end
	end
	if st.pool_line then fail("duplicate-pool", st.pool_line) end
	st.pool_line, st.pool, st.capacity = n, pool, size
end

-- A #DW line (DataWarp or NNF): jobdw, a stage line, or a refusal saying why.
local function dw_line(st, n, keys, vals, quoted)
	if keys[1] then fail("unknown-verb/dw", keys[1] .. "=") end
	local verb = vals[1]
	if verb == "jobdw" then return jobdw(st, n, keys, vals, quoted) end
	if DW_VERBS[verb] then return stage(st, n, verb, keys, vals, true) end
	if DW_REFUSED[verb] then fail("dw-unsupported/" .. DW_REFUSED[verb], verb) end
	fail("unknown-verb/dw", verb)
end

local function line(st, n, raw, kind)
	if #raw > MAX_LINE then fail("line-too-long", #raw, MAX_LINE) end
	if byte(raw, -1) == 13 then fail("crlf") end
	local _, i = find(raw, "^[\t -~\128-\255]*")
	if i < #raw then fail("control-char", byte(raw, i + 1)) end
	local p = kind == "dw" and "#DW" or "#BB_LUA"
	local content = sub(raw, #p + 1)
	if kind == "sbatch" then
		local spec
		spec, p, content = sbatch_content(raw)
		if spec == "" then fail("missing-value/sbatch") end
		if not content then fail("bad-bb-option") end
	elseif byte(raw, -1) == 92 then
		fail("continuation")
	end
	local keys, vals, quoted = tokenize(content)
	if p == "#DW" then st.dw = true end
	if #keys == 0 then return end
	if p == "#DW" then return dw_line(st, n, keys, vals, quoted) end
	if keys[1] then return pool_line(st, n, keys, vals, quoted) end
	if VERBS[vals[1]] then return stage(st, n, vals[1], keys, vals) end
	fail("unknown-verb", vals[1])
end

-- parse(text) -> { directives = {...}, pool = name|nil, capacity = bytes|nil,
--   scratch_names = {...}, errors = {...}, warnings = {...} }
function M.parse(text)
	local st = { directives = {}, dests = {}, dw_vars = {}, dw_names = { unpack(DW_SCRATCH_VARS) } }
	for _, v in ipairs(DW_SCRATCH_VARS) do st.dw_vars[v] = true end
	local errors, warnings = {}, {}
	local res = { directives = st.directives, errors = errors, warnings = warnings, scratch_names = {} }
	if type(text) ~= "string" then text = "" end
	if #text > M.MAX_SCRIPT_BYTES then
		errors[1] = err(0, "", "script-too-large", #text, M.MAX_SCRIPT_BYTES)
		return res
	end
	local lines, sbatch, first, pos = header(text)
	local seen, count = sbatch and contents(lines), 0
	for _, l in ipairs(lines) do
		local n, raw, kind = l[1], l[2], l[3]
		local dup = false
		if kind == "sbatch" then
			local _, p, content = sbatch_content(raw)
			dup = p and seen[p .. " " .. content]
		end
		if not dup then
			if not raw then
				errors[#errors + 1] = err(n, "line " .. n .. ": ", "header-too-long", MAX_HEADER)
				break
			end
			count = count + 1
			if count > M.MAX_DIRECTIVES then
				errors[#errors + 1] = err(n, "line " .. n .. ": ", "too-many-directives", M.MAX_DIRECTIVES)
				break
			end
			st.verb = nil
			local ok, e = pcall(line, st, n, raw, kind)
			if not ok then
				if type(e) ~= "table" then e = { "internal-error", tostring(e) } end
				local ctx = "line " .. n .. ": " .. (st.verb and st.verb .. ": " or "")
				errors[#errors + 1] = err(n, ctx, unpack(e))
				if #errors >= M.MAX_ERRORS then break end
			end
		end
	end
	if first then res.warnings = late(text, first, pos) end
	res.pool, res.capacity = st.pool, st.capacity
	if st.dw then res.scratch_names = st.dw_names end
	return res
end

return M
