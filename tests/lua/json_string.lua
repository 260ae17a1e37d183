-- Test runner: lua5.1 tests/lua/json_string.lua <lua_dir>
-- stdin: repeated frames "<nbytes>\n<bytes>"; stdout: per frame, the JSON text that
-- lua/bbstage/hooks.lua sends for the object {"s": <bytes>}, on one line.
local lua_dir = arg[1] or "lua"
package.path = lua_dir .. "/?.lua;" .. package.path
local hooks = require("bbstage.hooks")
while true do
  local header = io.read("*l")
  if not header then break end
  local n = tonumber(header)
  local text = n == 0 and "" or io.read(n)
  io.write(hooks.json({ s = text }), "\n")
  io.flush()
end
