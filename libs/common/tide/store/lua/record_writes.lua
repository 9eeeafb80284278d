-- Compare-and-set job records, each with what goes with it in the same step: the release of claims (a pod's
-- exit: a claim is released exactly when the exit is recorded) or the commit of a reservation (a gang whose pods
-- all started: its claims are made permanent exactly when the record says so).
-- ARGV[2] = JSON {"writes": [{"job": <record key>, "claims": [claim keys to release],
--                             "commit": [<reservation id>, <its key>] (only on a commit)}, ...]};
-- for the i-th write, ARGV[1 + 2i] is the record it expects and ARGV[2 + 2i] the record it writes. Every key
-- named is also in KEYS.
-- Returns {1, {code, ...}}, per write in order: 1 written (with its release or commit), 0 the record held
-- something else (nothing of that write done), 2 its reservation had lapsed (released now as any lapse is, the
-- record untouched); or {-1, key} (nothing done) or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
local releasing, committing, rkeys = {}, {}, {}
for i, w in ipairs(req.writes) do
  if not declared[w.job] then
    return {-1, w.job}
  end
  local claims, missing = claims_declared(w.claims)
  if claims == nil then
    return {-1, missing}
  end
  releasing[i] = claims
  if w.commit then
    local held = reservation_declared(w.commit[2])
    if held == nil then
      return {-1, w.commit[2]}
    end
    committing[i] = held
    rkeys[w.commit[1]] = w.commit[2]
  end
end
expire_lapsed(rkeys)  -- a reservation to commit: its own lapse is judged first
local out = {}
for i, w in ipairs(req.writes) do
  if redis.call('GET', w.job) ~= ARGV[1 + 2 * i] then
    table.insert(out, 0)  -- first: a write sent again after a lost reply finds its own record, not a lapse
  elseif w.commit and not redis.call('HGET', w.commit[2], 'claims') then
    table.insert(out, 2)
  else
    redis.call('SET', w.job, ARGV[2 + 2 * i])
    for _, c in ipairs(releasing[i]) do
      release_items(c[1], c[2])
    end
    if w.commit then
      for _, claim in ipairs(committing[i]) do
        if redis.call('EXISTS', claim[1]) == 1 then  -- a pod that ended before the commit released its claim
          redis.call('HSET', claim[1], 'resv', '')
        end
      end
      redis.call('DEL', w.commit[2])
      redis.call('ZREM', RESERVATIONS, w.commit[1])
    end
    table.insert(out, 1)
  end
end
return {1, out}
