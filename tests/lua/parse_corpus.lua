-- Test runner: lua5.1 tests/lua/parse_corpus.lua <lua_dir>
-- stdin: repeated frames "<nbytes>\n<bytes>"; stdout: one line per frame, either the
-- parse result as JSON or "!ERR <message>" if M.parse raised or returned a non-table.
local lua_dir = arg[1] or "lua"
package.path = lua_dir .. "/?.lua;" .. package.path
-- arg[2]: a bbstage_site.lua whose `schemes` the parser takes (as burst_buffer.lua hands it)
local site = arg[2] and dofile(arg[2]) or nil
local M = site and assert(loadfile(lua_dir .. "/bbstage/directives.lua"))(nil, site)
	or require("bbstage.directives")

local function str(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    if c == '"' then return '\\"' elseif c == "\\" then return "\\\\" end
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

local function val(v)
  if v == nil then return "null" end
  local t = type(v)
  if t == "string" then return str(v) end
  if t == "boolean" then return tostring(v) end
  if t == "number" then
    assert(v == math.floor(v), "non-integer number")
    return string.format("%.0f", v)
  end
  error("cannot encode " .. t)
end

local function obj(t, keys)
  local parts = {}
  for _, k in ipairs(keys) do
    if t[k] ~= nil or k == "pool" or k == "capacity" then parts[#parts + 1] = str(k) .. ":" .. val(t[k]) end
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

local DKEYS = { "index", "line", "verb", "source", "destination", "source_kind", "destination_kind", "tree", "glob" }

local function encode(r)
  local ds, es = {}, {}
  for i, d in ipairs(r.directives) do
    local o = obj(d, DKEYS)
    ds[i] = o:sub(1, -2) .. ',"options":' .. obj(d.options, { "checksum", "overwrite", "profile" }) .. "}"
  end
  for i, e in ipairs(r.errors) do es[i] = obj(e, { "line", "code", "message" }) end
  local ws, ns = {}, {}
  for i, e in ipairs(r.warnings) do ws[i] = obj(e, { "line", "code", "message" }) end
  for i, s in ipairs(r.scratch_names) do ns[i] = str(s) end
  return '{"directives":[' .. table.concat(ds, ",") .. '],"pool":' .. val(r.pool) .. ',"capacity":'
    .. val(r.capacity) .. ',"scratch_names":[' .. table.concat(ns, ",") .. '],"errors":['
    .. table.concat(es, ",") .. '],"warnings":[' .. table.concat(ws, ",") .. "]}"
end

while true do
  local header = io.read("*l")
  if not header then break end
  local n = tonumber(header)
  local text = n == 0 and "" or io.read(n)
  local ok, out = pcall(function()
    local r = M.parse(text)
    if type(r) ~= "table" then error("parse returned " .. type(r)) end
    return encode(r)
  end)
  if ok then io.write(out, "\n") else io.write("!ERR ", (tostring(out):gsub("\n", " ")), "\n") end
  io.flush()
end
