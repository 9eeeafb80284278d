-- Renew a lease if it still holds our token: KEYS[1] lease key, ARGV[1] token, ARGV[2] TTL (ms).
-- Returns 1 (renewed) or 0 (someone else holds it, or it lapsed).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
