-- Benchmark driver: lua5.1 hook_poll_loop.lua <lua_dir> <socket> <request> <interval> <stopfile>
-- Sends <request> (one JSON frame, as a hook does) again and again, one connection + ZMTP
-- handshake each, <interval> seconds apart, until <stopfile> exists; then prints one line
-- per request: "<start epoch seconds> <seconds> <status>" ("error:<kind>" when no answer).
local lua_dir, path, request = arg[1], arg[2], arg[3]
local interval, stopfile = tonumber(arg[4]), arg[5]
package.path = lua_dir .. "/?.lua;" .. package.path
local socket = require("socket")
local zmtp = require("bbstage.zmtp")

local function exists(name)
  local f = io.open(name, "r")
  if f then f:close() end
  return f ~= nil
end

local out = {}
while not exists(stopfile) do
  local t0 = socket.gettime()
  local reply, kind = zmtp.request(path, { request }, { timeout = 10 })
  local dt = socket.gettime() - t0
  out[#out + 1] = ("%.6f %.9f %s"):format(t0, dt, reply and (reply[1] or "") or ("error:" .. kind))
  socket.sleep(interval)
end
io.write(table.concat(out, "\n"), "\n")
