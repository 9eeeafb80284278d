-- Release claims (idempotent: a missing claim is skipped), and optionally a whole reservation.
-- ARGV[2] = JSON {"claims": [claim keys], "resv": <reservation id or "">, "rkey": <its key or "">}
-- Returns {1, number of claims released}, {-1, key} (nothing released) or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
local checked, missing = claims_declared(req.claims)
if checked == nil then
  return {-1, missing}
end
if req.resv ~= '' and not declared[req.rkey] then
  return {-1, req.rkey}
end
local released = 0
for _, c in ipairs(checked) do
  released = released + release_items(c[1], c[2])
end
if req.resv ~= '' then
  redis.call('DEL', req.rkey)
  redis.call('ZREM', RESERVATIONS, req.resv)
end
return {1, released}
