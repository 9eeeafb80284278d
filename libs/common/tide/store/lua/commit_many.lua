-- Make several reservations' claims permanent in one step, each unless its TTL lapsed first (commit.lua for a
-- list: each reservation is judged on its own, as if committed alone).
-- ARGV[2] = JSON {"rkeys": {resv id: reservation key}, "commits": [[<reservation id>, <its key>], ...]}
-- Returns {1, {1 | 0, ...}} (per reservation, in order: committed, or expired), {-1, key} or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
local claims_of = {}
for i, c in ipairs(req.commits) do
  local claims = reservation_declared(c[2])
  if claims == nil then
    return {-1, c[2]}
  end
  claims_of[i] = claims
  req.rkeys[c[1]] = c[2]  -- its own lapse is always judged here
end
expire_lapsed(req.rkeys)
local out = {}
for i, c in ipairs(req.commits) do
  if redis.call('HGET', c[2], 'claims') then
    for _, claim in ipairs(claims_of[i]) do
      if redis.call('EXISTS', claim[1]) == 1 then  -- a pod that ended before the commit released its claim already
        redis.call('HSET', claim[1], 'resv', '')
      end
    end
    redis.call('DEL', c[2])
    redis.call('ZREM', RESERVATIONS, c[1])
    table.insert(out, 1)
  else
    table.insert(out, 0)
  end
end
return {1, out}
