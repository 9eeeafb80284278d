-- Claim the slots of several gangs in one step, each gang all or nothing on its own, in order (a gang sees what
-- the gangs before it claimed): claim.lua for a list, as if each gang had been claimed alone, one after the other.
-- ARGV[2] = JSON {"rkeys": {resv id: reservation key},
--                 "gangs": [{"resv": <reservation id or "">, "rkey": <its key>, "ttl_ms": <ms, with resv>,
--                            "claims": [{"key": <claim key>, "alloc": <json string>,
--                                        "items": [[cap_key, used_key, field, amount], ...]}]}, ...]}
-- (every key named here is also in KEYS). Returns {1, {code, reason, code, reason, ...}} (per gang, in order:
-- 1 "ok" or 0 and why nothing of it was claimed), {-1, key} or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
for _, g in ipairs(req.gangs) do
  local missing = undeclared_gang_key(g)
  if missing then
    return {-1, missing}
  end
end
expire_lapsed(req.rkeys)
local out = {}
for _, g in ipairs(req.gangs) do
  local code, reason = claim_gang(g)
  table.insert(out, code)
  table.insert(out, reason)
end
return {1, out}
