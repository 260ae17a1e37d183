-- #BB_LUA directive parser for slurm_bb_job_process (grammar: docs/directives.md).
-- Mirrors bbstage/directives.py check for check; tests/corpus keeps the two in step.
-- Lua 5.1 to 5.4, string functions only, linear time, stops at the end of the script header.
-- slurmctld compiles this on every submission: keep it short (messages live in one string).
local M = {}
local find, sub, byte, match, upper, format = string.find, string.sub, string.byte, string.match,
	string.upper, string.format
local gsub, unpack, error, pcall, type, tonumber = string.gsub, table.unpack or unpack, error, pcall, type,
	tonumber
local ipairs, select, tostring = ipairs, select, tostring

M.MAX_SCRIPT_BYTES, M.MAX_LINE_BYTES, M.MAX_DIRECTIVES, M.MAX_ERRORS = 4194304, 4096, 256, 20
M.MAX_HEADER_LINES = 65536
local MAX_LINE, MAX_HEADER = 4096, 65536
local UNITS = { [""] = 1, K = 2 ^ 10, M = 2 ^ 20, G = 2 ^ 30, T = 2 ^ 40, P = 2 ^ 50 }
local STAGE_KEYS = { source = 1, destination = 1, checksum = 1, overwrite = 1, profile = 1 }
local VALUES = { checksum = { none = 1, xxh3 = 1, blake2b = 1 }, overwrite = { always = 1, never = 1, newer = 1 } }
local HINTS = { checksum = "none, xxh3 or blake2b", overwrite = "always, never or newer" }
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
bad-bb-option	#SBATCH --bb value must start with #BB_LUA (Slurm inserts it into the script as a line): write #SBATCH --bb="#BB_LUA ..."
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
unknown-variable	"%s" in %s: only a leading $BB_SCRATCH is expanded (use %%u for the user name, %%j for the job id)
bad-scheme	unsupported scheme in %s "%s": use an absolute path, $BB_SCRATCH/..., or s3://bucket/key
bad-bucket/key	%s "%s" has no key part: write s3://bucket/ for a whole bucket or s3://bucket/key
bad-bucket	bad S3 bucket in %s "%s": bucket names have 3-63 characters a-z 0-9 . - and start and end with a letter or digit
non-utf8	byte 0x%02x in %s "%s" is not UTF-8 and S3 keys are UTF-8 text: save the script as UTF-8 (iconv -f LATIN1 -t UTF-8) or rename the key
relative-path	relative path "%s" in %s: use an absolute path, $BB_SCRATCH/..., or s3://bucket/key
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
profile-without-s3	profile= applies only to s3:// locations: remove it
capacity-in-value	"capacity=" inside a value would be read by Slurm as a capacity request: rename the path
duplicate-destination	destination "%s" is also written by line %d: give each directive its own destination
bad-quote/pool	value of "%s" must not be quoted (Slurm reads pool= and capacity= verbatim)
capacity-without-pool	capacity= needs pool=: write pool=NAME capacity=SIZE
bad-size	bad capacity "%s": use a whole number of bytes with an optional K, M, G, T or P suffix (binary units), above 0 and below 8P
duplicate-pool	pool=/capacity= already given on line %d: use one line
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

local function sbatch_content(raw) -- spec of "#SBATCH --bb", then its content after #BB_LUA (or nil)
	local _, e = find(raw, "^#SBATCH[ \t]+%-%-bb=?")
	local spec = strip(sub(raw, e + 1))
	if #spec > 1 and byte(spec) == 34 and byte(spec, -1) == 34 then spec = sub(spec, 2, -2) end
	local c = byte(spec, 8)
	if sub(spec, 1, 7) == "#BB_LUA" and (not c or c == 32 or c == 9) then return spec, strip(sub(spec, 8)) end
	return spec
end

-- Directive lines of the header ({n, raw, is_sbatch}) and the set of #BB_LUA contents.
local function header(text)
	local out, seen, pos, n, len = {}, {}, 1, 0, #text
	while pos <= len do
		n = n + 1
		local e = find(text, "\n", pos, true) or len + 1
		local c = byte(text, pos)
		if c ~= 35 and e ~= pos then break end
		if n > MAX_HEADER then out[#out + 1] = { n }; break end
		if c == 35 then
			c = byte(text, pos + 1)
			if c == 66 and sub(text, pos, pos + 6) == "#BB_LUA" then
				c = byte(text, pos + 7)
				if e == pos + 7 or c == 32 or c == 9 then
					local raw = sub(text, pos, e - 1)
					out[#out + 1] = { n, raw, false }
					if e - pos <= MAX_LINE then seen[strip(sub(raw, 8))] = true end
				end
			elseif c == 83 and sub(text, pos, pos + 6) == "#SBATCH" then
				local raw = sub(text, pos, e - 1)
				local _, me = find(raw, "^#SBATCH[ \t]+%-%-bb")
				c = me and byte(raw, me + 1)
				if me and (not c or c == 61 or c == 32 or c == 9) then out[#out + 1] = { n, raw, true } end
			end
		end
		pos = e + 1
	end
	return out, seen
end

-- Split content into parallel arrays keys (false for a bare word), values, quoted.
local function tokenize(s)
	local keys, vals, quoted, p, n = {}, {}, {}, 1, #s
	while true do
		p = find(s, "[^ \t]", p)
		if not p then return keys, vals, quoted end
		local q, i = find(s, "[ \t=]", p) or n + 1, #keys + 1
		if byte(s, q) ~= 61 then
			keys[i], vals[i], quoted[i], p = false, sub(s, p, q - 1), false, q
		else
			local key = sub(s, p, q - 1)
			if key == "" then fail("bad-token/key") end
			keys[i], p = key, q + 1
			if byte(s, p) == 34 then
				local r, escaped, j, c = p + 1, false
				while true do
					j = find(s, '["\\]', r)
					c = j and byte(s, j + 1)
					if not j or (byte(s, j) == 92 and not c) then fail("unterminated-quote", key) end
					if byte(s, j) == 34 then break end
					if c ~= 34 and c ~= 92 then fail("bad-escape", key) end
					r, escaped = j + 2, true
				end
				if c and c ~= 32 and c ~= 9 then fail("bad-quote/after", key) end
				vals[i], quoted[i] = sub(s, p + 1, j - 1), true
				if escaped then vals[i] = gsub(vals[i], "\\(.)", "%1") end
				p = j + 1
			else
				q = find(s, "[ \t]", p) or n + 1
				vals[i], quoted[i] = sub(s, p, q - 1), false
				if find(vals[i], '"', 1, true) then fail("bad-quote/stray", key, key) end
				p = q
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

local function location(v, role, verb) -- kind, tree, glob
	local kind, path, c = "posix", v, byte(v)
	if c == 36 then
		if v ~= "$BB_SCRATCH" and sub(v, 1, 12) ~= "$BB_SCRATCH/" then fail("unknown-variable", v, role) end
		kind, path = "scratch", sub(v, 12)
	elseif c ~= 47 then
		if not find(v, "^[A-Za-z][A-Za-z0-9+%.%-]*://") then fail("relative-path", v, role) end
		if sub(v, 1, 5) ~= "s3://" then fail("bad-scheme", role, v) end
		local slash = find(v, "/", 6, true)
		if not slash then fail("bad-bucket/key", role, v) end
		local b = sub(v, 6, slash - 1)
		if #b < 3 or #b > 63 or not find(b, "^[a-z0-9][a-z0-9%.%-]*[a-z0-9]$") then fail("bad-bucket", role, v) end
		kind, path = "s3", sub(v, slash)
		local bad = non_utf8(v)
		if bad then fail("non-utf8", bad, role, v) end
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
	return kind, tree, glob
end

local function stage(st, n, verb, keys, vals)
	local kv = {}
	st.verb = verb
	for i = 2, #keys do
		local key, value = keys[i], vals[i]
		if not key then fail("bad-token", value) end
		if not STAGE_KEYS[key] then
			if key == "pool" or key == "capacity" then fail("unknown-key/pool") end
			fail("unknown-key", key)
		end
		if kv[key] then fail("duplicate-key", key) end
		if value == "" then fail("empty-value", key) end
		kv[key] = value
	end
	local src, dst = kv.source, kv.destination
	if not src then fail("missing-value", "source", "source") end
	if not dst then fail("missing-value", "destination", "destination") end
	local skind, stree, sglob = location(src, "source", verb)
	local dkind, dtree = location(dst, "destination", verb)
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
		if skind ~= "s3" and dkind ~= "s3" then fail("profile-without-s3") end
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
		local d, u = match(cap, "^([0-9]+)([KMGTPkmgtp]?)$")
		size = d and tonumber(d) * UNITS[upper(u)]
		if not size or size <= 0 or size >= 2 ^ 53 then fail("bad-size", cap) end
	end
	if st.pool_line then fail("duplicate-pool", st.pool_line) end
	st.pool_line, st.pool, st.capacity = n, pool, size
end

local function line(st, n, raw, sbatch)
	if #raw > MAX_LINE then fail("line-too-long", #raw, MAX_LINE) end
	if byte(raw, -1) == 13 then fail("crlf") end
	local i = find(raw, "[^\t -~\128-\255]")
	if i then fail("control-char", byte(raw, i)) end
	local content = sub(raw, 8)
	if sbatch then
		local spec
		spec, content = sbatch_content(raw)
		if spec == "" then fail("missing-value/sbatch") end
		if not content then fail("bad-bb-option") end
	elseif byte(raw, -1) == 92 then
		fail("continuation")
	end
	local keys, vals, quoted = tokenize(content)
	if #keys == 0 then return end
	if keys[1] then return pool_line(st, n, keys, vals, quoted) end
	if vals[1] == "stage_in" or vals[1] == "stage_out" then return stage(st, n, vals[1], keys, vals) end
	fail("unknown-verb", vals[1])
end

-- parse(text) -> { directives = {...}, pool = name|nil, capacity = bytes|nil, errors = {...} }
function M.parse(text)
	local st, errors = { directives = {}, dests = {} }, {}
	local res = { directives = st.directives, errors = errors }
	if type(text) ~= "string" then text = "" end
	if #text > M.MAX_SCRIPT_BYTES then
		errors[1] = err(0, "", "script-too-large", #text, M.MAX_SCRIPT_BYTES)
		return res
	end
	local lines, seen = header(text)
	local count = 0
	for _, l in ipairs(lines) do
		local n, raw, sbatch = l[1], l[2], l[3]
		if not (sbatch and seen[select(2, sbatch_content(raw)) or false]) then
			local ctx = "line " .. n .. ": "
			if not raw then
				errors[#errors + 1] = err(n, ctx, "header-too-long", MAX_HEADER)
				break
			end
			count = count + 1
			if count > M.MAX_DIRECTIVES then
				errors[#errors + 1] = err(n, ctx, "too-many-directives", M.MAX_DIRECTIVES)
				break
			end
			st.verb = nil
			local ok, e = pcall(line, st, n, raw, sbatch)
			if not ok then
				if type(e) ~= "table" then e = { "internal-error", tostring(e) } end
				errors[#errors + 1] = err(n, ctx .. (st.verb and st.verb .. ": " or ""), unpack(e))
				if #errors >= M.MAX_ERRORS then break end
			end
		end
	end
	res.pool, res.capacity = st.pool, st.capacity
	return res
end

return M
