-- #BB_LUA directive parser for slurm_bb_job_process (grammar: docs/directives.md).
-- Mirrors bbstage/directives.py check for check and message for message;
-- tests/corpus keeps them in step. Lua 5.1, string functions only, linear time.
local M = {}
local find, sub, byte, match, upper, concat = string.find, string.sub, string.byte,
  string.match, string.upper, table.concat
local tostring, type, pcall, error, tonumber, ipairs = tostring, type, pcall, error, tonumber, ipairs

M.MAX_SCRIPT_BYTES, M.MAX_LINE_BYTES, M.MAX_DIRECTIVES, M.MAX_ERRORS = 4194304, 4096, 256, 20
local MAX_LINE, MAX_CAPACITY = M.MAX_LINE_BYTES, 2 ^ 53
local LOC_HINT = "use an absolute path, $BB_SCRATCH/..., or s3://bucket/key"
local NAME_HINT = "use 1-64 characters A-Z a-z 0-9 _ . -"
local UNITS = { [""] = 1, K = 2 ^ 10, M = 2 ^ 20, G = 2 ^ 30, T = 2 ^ 40, P = 2 ^ 50 }
local STAGE_KEYS = { source = 1, destination = 1, checksum = 1, overwrite = 1, profile = 1 }
local VALUES = { checksum = { none = 1, xxh3 = 1, blake2b = 1 },
  overwrite = { always = 1, never = 1, newer = 1 } }
local HINTS = { checksum = "none, xxh3 or blake2b", overwrite = "always, never or newer" }

local function fail(code, msg) error({ code = code, msg = msg }, 0) end

local function strip(s)
  local a = find(s, "[^ \t]")
  if not a then return "" end
  local e = #s
  while byte(s, e) == 32 or byte(s, e) == 9 do e = e - 1 end
  return sub(s, a, e)
end

local function is_name(s) return #s <= 64 and find(s, "^[A-Za-z0-9_%.%-]+$") ~= nil end

-- Directive lines of the header: { {n, raw, is_sbatch}, ... } and the set of #BB_LUA contents.
local function header(text)
  local out, seen = {}, {}
  local pos, n, len = 1, 0, #text
  while pos <= len do
    n = n + 1
    local e = find(text, "\n", pos, true) or len + 1
    local c = byte(text, pos)
    if c ~= 35 then
      if e ~= pos then break end
    else
      c = byte(text, pos + 1)
      if c == 66 and sub(text, pos, pos + 6) == "#BB_LUA" then
        c = byte(text, pos + 7)
        if e == pos + 7 or c == 32 or c == 9 then
          local raw = sub(text, pos, e - 1)
          out[#out + 1] = { n, raw, false }
          if #raw <= MAX_LINE then seen[strip(sub(raw, 8))] = true end
        end
      elseif c == 83 and sub(text, pos, pos + 6) == "#SBATCH" then
        local raw = sub(text, pos, e - 1)
        local _, me = find(raw, "^#SBATCH[ \t]+%-%-bb")
        c = me and byte(raw, me + 1)
        if me and (c == nil or c == 61 or c == 32 or c == 9) then out[#out + 1] = { n, raw, true } end
      end
    end
    pos = e + 1
  end
  return out, seen
end

local function sbatch_spec(raw)
  local _, me = find(raw, "^#SBATCH[ \t]+%-%-bb")
  if byte(raw, me + 1) == 61 then me = me + 1 end
  local spec = strip(sub(raw, me + 1))
  if #spec >= 2 and byte(spec, 1) == 34 and byte(spec, -1) == 34 then spec = sub(spec, 2, -2) end
  return spec
end

local function bb_content(spec)
  local c = byte(spec, 8)
  if sub(spec, 1, 7) == "#BB_LUA" and (c == nil or c == 32 or c == 9) then return strip(sub(spec, 8)) end
end

-- Split content into { {k = key or nil, v = value, q = quoted}, ... }.
local function tokenize(s, ctx)
  local toks, p, n = {}, 1, #s
  while true do
    p = find(s, "[^ \t]", p)
    if not p then return toks end
    local q = find(s, "[ \t=]", p) or n + 1
    if byte(s, q) ~= 61 then
      toks[#toks + 1] = { v = sub(s, p, q - 1), q = false }
      p = q
    else
      local key = sub(s, p, q - 1)
      if key == "" then fail("bad-token", ctx .. '"=" without a key: write key=value') end
      p = q + 1
      if byte(s, p) == 34 then
        local buf, r = {}, p + 1
        while true do
          local i = find(s, '["\\]', r)
          if not i or (byte(s, i) == 92 and i >= n) then
            fail("unterminated-quote", ctx .. 'unterminated quote in value of "' .. key .. '": add the closing "')
          end
          buf[#buf + 1] = sub(s, r, i - 1)
          if byte(s, i) == 34 then p = i + 1; break end
          local c = sub(s, i + 1, i + 1)
          if c ~= '"' and c ~= "\\" then
            fail("bad-escape", ctx .. 'bad escape in quoted value of "' .. key
              .. '": only \\" and \\\\ are allowed inside quotes')
          end
          buf[#buf + 1] = c
          r = i + 2
        end
        local c = byte(s, p)
        if c and c ~= 32 and c ~= 9 then
          fail("bad-quote", ctx .. 'text after the closing quote in value of "' .. key
            .. '": put a space after the closing "')
        end
        toks[#toks + 1] = { k = key, v = concat(buf), q = true }
      else
        q = find(s, "[ \t]", p) or n + 1
        local v = sub(s, p, q - 1)
        if find(v, '"', 1, true) then
          fail("bad-quote", ctx .. 'stray quote in value of "' .. key .. '": quote the whole value, e.g. '
            .. key .. '="/a b/c"')
        end
        toks[#toks + 1] = { k = key, v = v, q = false }
        p = q
      end
    end
  end
end

local function unclosed_bracket(path)
  local i = find(path, "[", 1, true)
  while i do
    local j, k = find(path, "]", i + 1, true), find(path, "/", i + 1, true)
    if not j or (k and k < j) then return true end
    i = find(path, "[", j + 1, true)
  end
  return false
end

local function var_fail(ctx, q, role)
  fail("unknown-variable", ctx .. sub(q, 2) .. " in " .. role
    .. ": only a leading $BB_SCRATCH is expanded (use %u for the user name, %j for the job id)")
end

local function location(v, role, verb, ctx)
  local q = ' "' .. v .. '"'
  local kind, path
  if byte(v, 1) == 36 then
    if v ~= "$BB_SCRATCH" and sub(v, 1, 12) ~= "$BB_SCRATCH/" then var_fail(ctx, q, role) end
    kind, path = "scratch", sub(v, 12)
  elseif byte(v, 1) == 47 then
    kind, path = "posix", v
  elseif find(v, "^[A-Za-z][A-Za-z0-9+%.%-]*://") then
    if sub(v, 1, 5) ~= "s3://" then fail("bad-scheme", ctx .. "unsupported scheme in " .. role .. q .. ": " .. LOC_HINT) end
    local slash = find(v, "/", 6, true)
    if not slash then
      fail("bad-bucket", ctx .. role .. q .. " has no key part: write s3://bucket/ for a whole bucket or s3://bucket/key")
    end
    local bucket = sub(v, 6, slash - 1)
    if #bucket < 3 or #bucket > 63 or not find(bucket, "^[a-z0-9][a-z0-9%.%-]*[a-z0-9]$") then
      fail("bad-bucket", ctx .. "bad S3 bucket in " .. role .. q
        .. ": bucket names have 3-63 characters a-z 0-9 . - and start and end with a letter or digit")
    end
    kind, path = "s3", sub(v, slash)
  else
    fail("relative-path", ctx .. "relative path" .. q .. " in " .. role .. ": " .. LOC_HINT)
  end
  if find(path .. "/", "/../", 1, true) then
    fail("dot-dot", ctx .. '".." component in ' .. role .. q .. ": write the path without ..")
  end
  if find(path, "$", 1, true) then var_fail(ctx, q, role) end
  local tree = byte(v, -1) == 47 or v == "$BB_SCRATCH"
  local glob = find(path, "[%*%?%[]") ~= nil
  if glob then
    if role == "destination" or verb == "stage_out" then
      fail("bad-glob", ctx .. "wildcard in " .. role .. q .. ": wildcards are only allowed in a stage_in source")
    end
    if tree then fail("bad-glob", ctx .. "wildcard source" .. q .. " ends with /: drop the / or the wildcard") end
    if kind == "posix" and find(match(path, "^/([^/]*)"), "[%*%?%[]") then
      fail("bad-glob", ctx .. "wildcard in the first directory of source" .. q
        .. ": start with a literal directory, e.g. /data/...")
    end
    if unclosed_bracket(path) then fail("bad-glob", ctx .. "unclosed [ in source" .. q .. ": close it with ]") end
  end
  return kind, tree, glob
end

local function stage(st, n, verb, toks)
  local ctx, kv = "line " .. n .. ": " .. verb .. ": ", {}
  for i = 2, #toks do
    local key, value = toks[i].k, toks[i].v
    if not key then fail("bad-token", ctx .. '"' .. value .. '" is not key=value: write key=value') end
    if not STAGE_KEYS[key] then
      if key == "pool" or key == "capacity" then
        fail("unknown-key", ctx .. "pool= and capacity= go on a #BB_LUA line of their own")
      end
      fail("unknown-key", ctx .. 'unknown key "' .. key .. '": use source, destination, checksum, overwrite or profile')
    end
    if kv[key] then fail("duplicate-key", ctx .. '"' .. key .. '" given twice: keep one') end
    if value == "" then fail("empty-value", ctx .. 'empty value for "' .. key .. '": give a value') end
    kv[key] = value
  end
  for _, role in ipairs({ "source", "destination" }) do
    if not kv[role] then fail("missing-value", ctx .. "missing " .. role .. "=: add " .. role .. "=<location>") end
  end
  local src, dst = kv.source, kv.destination
  local skind, stree, sglob = location(src, "source", verb, ctx)
  local dkind, dtree = location(dst, "destination", verb, ctx)
  if sglob then
    if not dtree then
      fail("bad-glob", ctx .. 'destination "' .. dst .. '" of a wildcard source must be a directory ending in /: add the /')
    end
  elseif stree ~= dtree then
    fail("tree-mismatch", ctx .. 'source "' .. src .. '" and destination "' .. dst
      .. '" must both be directories (ending in /) or both files')
  end
  local options = { checksum = "none", overwrite = "always" }
  for _, opt in ipairs({ "checksum", "overwrite" }) do
    local v = kv[opt]
    if v then
      if not VALUES[opt][v] then fail("bad-option-value", ctx .. opt .. '="' .. v .. '" is not allowed: use ' .. HINTS[opt]) end
      options[opt] = v
    end
  end
  if kv.profile then
    if not is_name(kv.profile) then
      fail("bad-option-value", ctx .. 'profile="' .. kv.profile .. '" is not a valid profile name: ' .. NAME_HINT)
    end
    if skind ~= "s3" and dkind ~= "s3" then fail("profile-without-s3", ctx .. "profile= applies only to s3:// locations: remove it") end
    options.profile = kv.profile
  end
  for i = 2, #toks do
    if find(toks[i].v, "capacity=", 1, true) then
      fail("capacity-in-value", ctx .. '"capacity=" inside a value would be read by Slurm as a capacity request: rename the path')
    end
  end
  local e = #dst
  while byte(dst, e) == 47 do e = e - 1 end
  local norm = sub(dst, 1, e)
  if st.dests[norm] then
    fail("duplicate-destination", ctx .. 'destination "' .. dst .. '" is also written by line '
      .. st.dests[norm] .. ": give each directive its own destination")
  end
  st.dests[norm] = n
  local d = st.directives
  d[#d + 1] = { index = #d, line = n, verb = verb, source = src, destination = dst, source_kind = skind,
    destination_kind = dkind, tree = stree, glob = sglob, options = options }
end

local function pool_line(st, n, toks)
  local ctx, kv = "line " .. n .. ": ", {}
  for i = 1, #toks do
    local key, value = toks[i].k, toks[i].v
    if not key then fail("bad-token", ctx .. '"' .. value .. '" is not key=value: write key=value') end
    if key ~= "pool" and key ~= "capacity" then
      fail("unknown-key", ctx .. 'unknown key "' .. key
        .. '" on a line without a verb: start the line with stage_in or stage_out, or use only pool= and capacity=')
    end
    if kv[key] then fail("duplicate-key", ctx .. '"' .. key .. '" given twice: keep one') end
    if toks[i].q then
      fail("bad-quote", ctx .. 'value of "' .. key .. '" must not be quoted (Slurm reads pool= and capacity= verbatim)')
    end
    if value == "" then fail("empty-value", ctx .. 'empty value for "' .. key .. '": give a value') end
    kv[key] = value
  end
  if kv.capacity and not kv.pool then fail("capacity-without-pool", ctx .. "capacity= needs pool=: write pool=NAME capacity=SIZE") end
  if not is_name(kv.pool) then fail("bad-option-value", ctx .. 'pool="' .. kv.pool .. '" is not a valid pool name: ' .. NAME_HINT) end
  local size
  if kv.capacity then
    local d, u = match(kv.capacity, "^([0-9]+)([KMGTPkmgtp]?)$")
    size = d and tonumber(d) * UNITS[upper(u)]
    if not size or size <= 0 or size >= MAX_CAPACITY then
      fail("bad-size", ctx .. 'bad capacity "' .. kv.capacity .. '": use a whole number of bytes with an optional K, M, G, T'
        .. " or P suffix (binary units), above 0 and below 8P")
    end
  end
  if st.pool_line then fail("duplicate-pool", ctx .. "pool=/capacity= already given on line " .. st.pool_line .. ": use one line") end
  st.pool_line, st.pool, st.capacity = n, kv.pool, size
end

local function line(st, n, raw, sbatch)
  local ctx, content = "line " .. n .. ": "
  if #raw > MAX_LINE then
    fail("line-too-long", ctx .. "directive line is " .. #raw .. " bytes, over the " .. MAX_LINE
      .. " byte limit: shorten the paths or stage a directory")
  end
  if byte(raw, -1) == 13 then fail("crlf", ctx .. "line ends with a carriage return (DOS line ending): convert the script with dos2unix") end
  local i = find(raw, "[%z\1-\8\11-\31\127]")
  if i then fail("control-char", ctx .. string.format("control character 0x%02x in directive: remove it", byte(raw, i))) end
  if sbatch then
    local spec = sbatch_spec(raw)
    if spec == "" then fail("missing-value", ctx .. '#SBATCH --bb has no value: write #SBATCH --bb="#BB_LUA ..."') end
    content = bb_content(spec)
    if not content then
      fail("bad-bb-option", ctx .. "#SBATCH --bb value must start with #BB_LUA (Slurm inserts it into the script as a line):"
        .. ' write #SBATCH --bb="#BB_LUA ..."')
    end
  else
    if byte(raw, -1) == 92 then
      fail("continuation", ctx .. 'line ends with "\\": continuation lines are not supported: put the whole directive on one line')
    end
    content = sub(raw, 8)
  end
  local toks = tokenize(content, ctx)
  if #toks == 0 then return end
  if toks[1].k then return pool_line(st, n, toks) end
  local verb = toks[1].v
  if verb == "stage_in" or verb == "stage_out" then return stage(st, n, verb, toks) end
  fail("unknown-verb", ctx .. 'unknown verb "' .. verb .. '": use stage_in or stage_out (or pool=NAME capacity=SIZE on a line of its own)')
end

-- parse(text) -> { directives = {...}, pool = name|nil, capacity = bytes|nil, errors = {...} }
function M.parse(text)
  local st = { directives = {}, dests = {} }
  local errors = {}
  local res = { directives = st.directives, errors = errors }
  if type(text) ~= "string" then text = "" end
  if #text > M.MAX_SCRIPT_BYTES then
    errors[1] = { line = 0, code = "script-too-large", message = "script: " .. #text .. " bytes is over the "
      .. M.MAX_SCRIPT_BYTES .. " byte limit: shorten the script" }
    return res
  end
  local lines, seen = header(text)
  local count = 0
  for _, l in ipairs(lines) do
    local n, raw, sbatch = l[1], l[2], l[3]
    if not (sbatch and seen[bb_content(sbatch_spec(raw)) or false]) then
      count = count + 1
      if count > M.MAX_DIRECTIVES then
        errors[#errors + 1] = { line = n, code = "too-many-directives", message = "line " .. n .. ": more than "
          .. M.MAX_DIRECTIVES .. " directive lines: stage a directory tree or a wildcard instead of single files" }
        break
      end
      local ok, err = pcall(line, st, n, raw, sbatch)
      if not ok then
        if type(err) ~= "table" then err = { code = "internal-error", msg = "line " .. n .. ": " .. tostring(err) } end
        errors[#errors + 1] = { line = n, code = err.code, message = err.msg }
        if #errors >= M.MAX_ERRORS then break end
      end
    end
  end
  res.pool, res.capacity = st.pool, st.capacity
  return res
end

return M
