-- Keep a reservation alive while its placer settles a start that went unanswered (tide.store.claims.extend).
-- ARGV[2] = JSON {"resv": <reservation id>, "ttl_ms": <new lifetime from now>, "revive": <bool>}
-- Returns {1, "ok"}; {0, "lapsed"} when it is gone or already past its TTL (the sweep will roll it back; with
-- "revive", only when it is gone: a new leader takes over a reservation that lapsed while none led, its claims
-- still held); or {-2, "fenced"}. It never shortens a reservation.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
local score = redis.call('ZSCORE', RESERVATIONS, req.resv)
local now = now_ms()
if not score or (tonumber(score) <= now and not req.revive) then
  return {0, 'lapsed'}
end
local until_ms = now + tonumber(req.ttl_ms)
if until_ms > tonumber(score) then
  redis.call('ZADD', RESERVATIONS, 'XX', until_ms, req.resv)
end
return {1, 'ok'}
