-- bbstage.zmtp: a minimal pure-Lua (5.1 to 5.4) ZeroMQ REQ client (ZMTP 3.0, NULL mechanism)
-- over lua-socket's Unix stream sockets, i.e. what libzmq calls "ipc://<path>".
-- One call = one connection = one request and its reply.  See docs/protocol.md.
--
--   local zmtp = require("bbstage.zmtp")
--   local reply, kind, err = zmtp.request("/run/bbstage/control.sock", { json }, { timeout = 30 })
--   -- reply = { status, message } (the frames after the REQ delimiter), or
--   -- nil, kind, err with kind = "unreachable" | "timeout" | "protocol"
--
-- Note: lua-socket ignores SIGPIPE once loaded; a broken pipe is an error return here.
-- socket.core has gettime and sleep; the "socket" wrapper costs ~0.1 ms more to load.
local socket = require("socket.core")
local unix = require("socket.unix")

local M = {}
local char, byte, floor = string.char, string.byte, math.floor
local unpack = table.unpack or unpack                  -- a global only in Lua 5.1

local MORE, LONG, COMMAND = 1, 2, 4                    -- frame flag bits
local MAX_FRAME = 2 ^ 32                               -- sanity bound on a peer's frame size
-- Greeting: signature, version 3.0, mechanism "NULL" padded to 20, as-server 0, filler.
local GREETING = "\255" .. ("\0"):rep(8) .. "\127" .. "\3\0" .. "NULL" .. ("\0"):rep(16)
  .. "\0" .. ("\0"):rep(31)
local NULL_MECH = "NULL" .. ("\0"):rep(16)

-- Big-endian 64-bit length without bit ops (exact: doubles hold integers up to 2^53).
local function be64(n)
  local b = {}
  for i = 8, 1, -1 do b[i] = n % 256; n = floor(n / 256) end
  return char(unpack(b))
end

-- Frame header: 1-byte size up to 255, else LONG with an 8-byte size.
local function header(flags, n)
  if n > 255 then return char(flags + LONG) .. be64(n) end
  return char(flags, n)
end

-- READY command; metadata: 1-byte name length, name, 4-byte value length, value.
local READY_BODY = "\5READY" .. "\11Socket-Type" .. "\0\0\0\3" .. "REQ"
local READY = header(COMMAND, #READY_BODY) .. READY_BODY

local function remaining(deadline) return deadline - socket.gettime() end

-- Read exactly n bytes before the deadline.  Failure kinds: "timeout", "dropped".
local function recv(c, n, deadline)
  if n == 0 then return "" end
  local left = remaining(deadline)
  if left <= 0 then return nil, "timeout" end
  c:settimeout(left)                          -- lua-socket timeouts are per call
  local data, err = c:receive(n)
  if data then return data end
  if err == "timeout" then return nil, "timeout" end
  return nil, "dropped", err
end

local function send(c, data, deadline)
  local i = 1
  while i <= #data do
    local left = remaining(deadline)
    if left <= 0 then return nil, "timeout" end
    c:settimeout(left)
    local last, err, partial = c:send(data, i)
    if last then return true end
    if err ~= "timeout" then return nil, "dropped", err end
    i = partial + 1
  end
  return true
end

-- Read one frame: body, flags | nil, kind, why.  Works however the bytes are fragmented.
local function read_frame(c, deadline)
  local h, kind, why = recv(c, 2, deadline)
  if not h then return nil, kind, why end
  local flags, size = byte(h, 1, 2)
  if flags >= 8 then return nil, "protocol", ("bad frame flags 0x%02x"):format(flags) end
  if flags % 4 >= LONG then                   -- 8-byte size: we already hold its first byte
    local rest, k, w = recv(c, 7, deadline)
    if not rest then return nil, k, w end
    for i = 1, 7 do size = size * 256 + byte(rest, i) end
    if size > MAX_FRAME then return nil, "protocol", "absurd frame size " .. size end
  end
  local body, k, w = recv(c, size, deadline)
  if not body then return nil, k, w end
  return body, flags
end

-- Greeting + NULL handshake, send the request, read the reply frames.
local function exchange(c, msg, deadline)
  -- Our whole greeting first (libzmq waits for it), our READY right behind it.
  local ok, kind, why = send(c, GREETING .. READY, deadline)
  if not ok then return nil, kind, why end
  local g
  g, kind, why = recv(c, 64, deadline)
  if not g then return nil, kind, why end
  if byte(g, 1) ~= 255 or byte(g, 10) ~= 127 then return nil, "protocol", "not a ZMTP peer" end
  if byte(g, 11) < 3 then return nil, "protocol", "peer speaks ZMTP " .. byte(g, 11) end
  if g:sub(13, 32) ~= NULL_MECH then return nil, "protocol", "peer wants a security mechanism" end
  local body, flags, w = read_frame(c, deadline)
  if not body then return nil, flags, w end
  local name = body:sub(2, 1 + (byte(body, 1) or 0))
  if flags < COMMAND or name ~= "READY" then  -- metadata (Socket-Type ROUTER) is ignored
    if name == "ERROR" then name = "ERROR: " .. body:sub(8) end
    return nil, "protocol", "expected READY, got " .. (flags < COMMAND and "a message" or name)
  end
  -- The peer is ready: only now send message frames.
  ok, kind, why = send(c, msg, deadline)
  if not ok then return nil, kind, why end
  local reply = {}
  repeat
    body, flags, why = read_frame(c, deadline)
    if not body then return nil, flags, why end
    if flags < COMMAND then reply[#reply + 1] = body end  -- skip commands (e.g. PING)
  until flags < COMMAND and flags % 2 == 0
  if reply[1] ~= "" then return nil, "protocol", "reply lacks the REQ empty delimiter" end
  table.remove(reply, 1)
  return reply
end

-- One connection attempt.  Kinds: "connect" (with errno text), "dropped", "timeout", "protocol".
local function attempt(path, msg, deadline)
  local c, err = unix.stream()
  if not c then return nil, "connect", err end
  c:settimeout(math.max(remaining(deadline), 0))
  local ok
  ok, err = c:connect(path)
  if not ok then c:close(); return nil, "connect", err end
  local res = { pcall(exchange, c, msg, deadline) }
  c:close()
  if not res[1] then error(res[2], 0) end
  return res[2], res[3], res[4]
end

-- request(path, frames, opts) -> reply_frames | nil, kind, message
-- opts.timeout: overall deadline in seconds (default 10), for all attempts together.
-- opts.retry_until: absolute socket.gettime() after which no reconnect is tried
-- (default and maximum: the deadline).
-- opts.connect_grace: seconds to keep trying to connect before the first connection
-- (default 0: fail at once), so a daemon restart is not mistaken for "not running".
function M.request(path, frames, opts)
  opts = opts or {}
  assert(type(frames) == "table" and #frames > 0, "zmtp.request: frames must be a non-empty list")
  local timeout = opts.timeout or 10
  local deadline = socket.gettime() + timeout
  local retry_until = math.min(opts.retry_until or deadline, deadline)
  local parts = { header(MORE, 0) }           -- REQ envelope: the empty delimiter
  for i, f in ipairs(frames) do
    parts[#parts + 1] = header(i < #frames and MORE or 0, #f)
    parts[#parts + 1] = f
  end
  local msg = table.concat(parts)
  local backoff, n, connected = 0.1, 0, false
  local grace_until = socket.gettime() + (opts.connect_grace or 0)
  while true do
    n = n + 1
    local reply, kind, why = attempt(path, msg, deadline)
    if reply then return reply end
    connected = connected or kind ~= "connect"
    local busy = kind == "connect" and (why == "timeout" or tostring(why):find("temporarily"))
    if kind == "connect" and not connected and not busy and socket.gettime() >= grace_until then
      return nil, "unreachable", ("staging daemon not reachable at %s: %s"):format(path, why)
    elseif kind == "protocol" then
      return nil, "protocol", ("staging daemon at %s: protocol error: %s"):format(path, why)
    end
    -- Dropped connection (daemon restarting) or a retry that cannot connect yet: back off.
    local now = socket.gettime()
    if kind == "timeout" or now >= deadline then
      return nil, "timeout", ("staging daemon at %s did not answer within %g s%s"):format(
        path, timeout, kind == "timeout" and "" or " (last error: " .. tostring(why) .. ")")
    elseif now >= retry_until then
      return nil, "unreachable", ("staging daemon at %s: connection lost, %d attempts, last: %s")
        :format(path, n, tostring(why))
    end
    socket.sleep(math.min(backoff, retry_until - now))
    backoff = math.min(backoff * 2, 1)
  end
end

return M
