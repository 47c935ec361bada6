-- wrk script of bench/api.py: every request a lane submit to a new thread
-- (an idle lane, dispatched at once). Arguments after `--`: the API key, a
-- prefix unique to the run and the agent. Prints one JSON line when done.
local threads = 0

function setup(thread)
    threads = threads + 1
    thread:set("thread_no", threads)
end

function init(args)
    key = args[1]
    prefix = args[2]
    body = string.format('{"agent": "%s", "input": {}}', args[3])
    sent = 0
    wrk.headers["Authorization"] = "Bearer " .. key
    wrk.headers["Content-Type"] = "application/json"
end

function request()
    sent = sent + 1
    local path = string.format("/v1/threads/%s-%d-%d/requests", prefix, thread_no, sent)
    return wrk.format("POST", path, nil, body)
end

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        '{"requests": %d, "duration_us": %d, "errors": %d, "p50_us": %d, "p99_us": %d}\n',
        summary.requests, summary.duration,
        e.connect + e.read + e.write + e.status + e.timeout,
        latency:percentile(50), latency:percentile(99)))
end
