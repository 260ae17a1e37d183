-- Test helper: lua5.N tests/lua/grammar.lua <lua_dir> [bbstage_site.lua]
-- Loads <lua_dir>/bbstage/directives.lua (with the site file's table, as burst_buffer.lua
-- hands it, or none) and prints its grammar tables (M.GRAMMAR), one value a line, sorted:
--   NAME[key][key]<TAB>type<TAB>value
-- keys "quoted" or numbers; type string, boolean, integer or float (Lua 5.3+), number (5.1, 5.2).
local lua_dir, site_file = arg[1], arg[2]
local site = site_file and dofile(site_file) or nil
local M = assert(loadfile(lua_dir .. "/bbstage/directives.lua"))(nil, site)
local out = {}

local function walk(path, v)
	local t = type(v)
	if t == "table" then
		for k, x in pairs(v) do
			walk(path .. "[" .. (type(k) == "string" and '"' .. k .. '"' or tostring(k)) .. "]", x)
		end
	elseif t == "number" then
		out[#out + 1] = path .. "\t" .. (math.type and math.type(v) or "number") .. "\t" .. string.format("%.17g", v)
	elseif t == "string" then
		out[#out + 1] = path .. "\tstring\t\"" .. v .. '"'
	else
		out[#out + 1] = path .. "\t" .. t .. "\t" .. tostring(v)
	end
end

for name, v in pairs(M.GRAMMAR) do walk(name, v) end
table.sort(out)
io.write(table.concat(out, "\n"), "\n")
