-- Compare-and-set: replace KEYS[1] with ARGV[2] only if it still holds ARGV[1]. Returns 1 or 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
