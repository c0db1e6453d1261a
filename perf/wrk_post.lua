-- wrk script of perf/httpbench.py: POST /route with bodies read from a file, round robin.
--
--   wrk -t1 -c8 -d3s -s perf/wrk_post.lua http://127.0.0.1:PORT -- BODIES CONTENT_TYPE
--
-- BODIES holds one request body after another, each as "<length in bytes>\n<bytes>"
-- (binary-safe). Every request is formatted once, in init; request() only picks the next
-- one. done() prints one line "CSLB_WRK {json}" with the totals and latency percentiles
-- (microseconds) for the Python side to parse.

local requests = {}
local count = 0
local counter = 0

function init(args)
  local path, ctype = args[1], args[2]
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  local pos = 1
  while pos <= #data do
    local nl = assert(string.find(data, "\n", pos, true), "bad bodies file: no length line")
    local len = assert(tonumber(string.sub(data, pos, nl - 1)), "bad bodies file: length")
    local body = string.sub(data, nl + 1, nl + len)
    count = count + 1
    requests[count] = wrk.format("POST", "/route", { ["Content-Type"] = ctype }, body)
    pos = nl + len + 1
  end
  assert(count > 0, "bad bodies file: no body")
  counter = math.random(count) - 1
end

function request()
  counter = counter % count + 1
  return requests[counter]
end

function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    'CSLB_WRK {"requests": %d, "duration_us": %d, "bytes": %d, "connect_errors": %d, ' ..
    '"read_errors": %d, "write_errors": %d, "status_errors": %d, "timeouts": %d, ' ..
    '"p50_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
