-- Claim every slot of a set of pods in one atomic step: all or nothing.
-- ARGV[2] = JSON {"rkeys": {resv id: reservation key}, "resv": <reservation id or "">, "rkey": <its key>,
--                 "ttl_ms": <ms, with resv>,
--                 "claims": [{"key": <claim key>, "alloc": <json string>,
--                             "items": [[cap_key, used_key, field, amount], ...]}]}
-- (every key named here is also in KEYS). With a reservation the claims lapse after ttl_ms unless commit.lua
-- runs first. Returns {1, "ok"}, {0, reason} (nothing claimed), {-1, key} or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
local missing = undeclared_gang_key(req)
if missing then
  return {-1, missing}
end
expire_lapsed(req.rkeys)
local code, reason = claim_gang(req)
return {code, reason}
