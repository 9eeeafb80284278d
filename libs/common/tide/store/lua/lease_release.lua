-- Give a lease up if it still holds our token: KEYS[1] lease key, ARGV[1] token. Returns 1 or 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
