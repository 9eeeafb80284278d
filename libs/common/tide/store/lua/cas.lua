-- Compare-and-set: replace KEYS[1] with ARGV[2] only if it still holds ARGV[1]. Returns 1 or 0.
-- With KEYS[2] (the pending set), a successful set also removes ARGV[3] from it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  if KEYS[2] then
    redis.call('ZREM', KEYS[2], ARGV[3])
  end
  return 1
end
return 0
