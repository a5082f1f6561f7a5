-- wrk script of the gateway benchmark (benchmarks/wrk.py): POSTs the body in the file
-- $LLMGW_WRK_BODY (headers come on wrk's command line, -H), and prints one JSON line of
-- what the run measured when it is done.

local file = assert(io.open(assert(os.getenv("LLMGW_WRK_BODY"), "LLMGW_WRK_BODY unset"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    'LLMGW_WRK {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    errors.connect, errors.read, errors.write, errors.status, errors.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
