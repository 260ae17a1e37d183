-- Test/benchmark driver: lua5.1 zmtp_loop.lua <lua_dir> <socket> <count> [timeout]
-- Sends <count> sequential requests (one connection + handshake each) with frame
-- "req <i>"; prints one line per request: "<i> <seconds> <status> <message>",
-- or "<i> <seconds> error <kind> <message>".
local lua_dir, path, count = arg[1], arg[2], tonumber(arg[3])
local timeout = tonumber(arg[4] or "10")
package.path = lua_dir .. "/?.lua;" .. package.path
local socket = require("socket")
local zmtp = require("bbstage.zmtp")

local out = {}
for i = 1, count do
  local t0 = socket.gettime()
  local reply, kind, err = zmtp.request(path, { "req " .. i }, { timeout = timeout })
  local dt = socket.gettime() - t0
  if reply then
    out[#out + 1] = ("%d %.9f %s %s"):format(i, dt, reply[1] or "", reply[2] or "")
  else
    out[#out + 1] = ("%d %.9f error %s %s"):format(i, dt, kind, err)
  end
end
io.write(table.concat(out, "\n"), "\n")
