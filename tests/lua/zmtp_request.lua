-- Test driver: lua5.1 zmtp_request.lua <lua_dir> <socket> <timeout> <frame>...
-- A frame "@<file>" is read from that file (argv strings are limited to 128 KiB).
-- Prints "ok <n>" then one "frame <len> <hex>" line per reply frame, or
-- "error <kind> <message>"; last line "elapsed <seconds>".  Exit 0 on success, 1 on error.
local lua_dir, path, timeout = arg[1], arg[2], tonumber(arg[3])
package.path = lua_dir .. "/?.lua;" .. package.path
local socket = require("socket")
local zmtp = require("bbstage.zmtp")

local frames = {}
for i = 4, #arg do
  local a = arg[i]
  if a:sub(1, 1) == "@" then
    local f = assert(io.open(a:sub(2), "rb"))
    a = f:read("*a")
    f:close()
  end
  frames[#frames + 1] = a
end

local function hex(s)
  return (s:gsub(".", function(ch) return ("%02x"):format(ch:byte()) end))
end

local t0 = socket.gettime()
local reply, kind, err = zmtp.request(path, frames, { timeout = timeout })
local elapsed = socket.gettime() - t0
if reply then
  print("ok " .. #reply)
  for _, f in ipairs(reply) do print("frame " .. #f .. " " .. hex(f)) end
else
  print("error " .. kind .. " " .. err)
end
print(("elapsed %.6f"):format(elapsed))
os.exit(reply and 0 or 1)
