-- Claim the slots of several gangs in one step, each gang all or nothing on its own, in order (a gang sees what
-- the gangs before it claimed): claim.lua for a list, as if each gang had been claimed alone, one after the other.
-- ARGV[2] = JSON {"rkeys": {resv id: reservation key},
--                 "gangs": [{"resv": <reservation id or "">, "rkey": <its key>, "ttl_ms": <ms, with resv>,
--                            "claims": [{"key": <claim key>, "alloc": <json string>,
--                                        "items": [[cap_key, used_key, field, amount], ...]}],
--                            "record": {"job": <record key>, "at": n, "dequeue": <job id or "">} (optional)}, ...]}
-- and "pending": <the pending set's key> when a record dequeues (every key named here is also in KEYS). A gang
-- with a record claims only if its job's record still holds ARGV[n], and then writes ARGV[n + 1] in the same step
-- (and with "dequeue" takes the job out of the pending set): its reservation and the record naming it are one
-- write.
-- Returns {1, {code, reason, code, reason, ...}} (per gang, in order: 1 "ok", 0 and why nothing of it was
-- claimed, or 0 "record changed"), {-1, key} or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
if req.pending and not declared[req.pending] then
  return {-1, req.pending}
end
for _, g in ipairs(req.gangs) do
  local missing = undeclared_gang_key(g)
  if missing then
    return {-1, missing}
  end
  if g.record and not declared[g.record.job] then
    return {-1, g.record.job}
  end
end
expire_lapsed(req.rkeys)
local out = {}
for _, g in ipairs(req.gangs) do
  if g.record and redis.call('GET', g.record.job) ~= ARGV[g.record.at] then
    table.insert(out, 0)
    table.insert(out, 'record changed')
  else
    local code, reason = claim_gang(g)
    if code == 1 and g.record then
      redis.call('SET', g.record.job, ARGV[g.record.at + 1])
      if g.record.dequeue ~= '' then
        redis.call('ZREM', req.pending, g.record.dequeue)
      end
    end
    table.insert(out, code)
    table.insert(out, reason)
  end
end
return {1, out}
