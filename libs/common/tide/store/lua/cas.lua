-- Compare-and-set: replace KEYS[1] with ARGV[2] only if it still holds ARGV[1]. Returns 1, 0, or -2 (fenced).
-- KEYS[2] (the pending set): with ARGV[3] ~= '', a successful set also removes job ARGV[3] from it.
-- KEYS[3] (the placer leader lease): with ARGV[4] ~= '' (a placer's token), nothing is written unless the
-- lease holds exactly that token.
if ARGV[4] and ARGV[4] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[4] then
  return -2
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  if ARGV[3] and ARGV[3] ~= '' then
    redis.call('ZREM', KEYS[2], ARGV[3])
  end
  return 1
end
return 0
