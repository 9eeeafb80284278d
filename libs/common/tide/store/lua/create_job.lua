-- Store a new job and enqueue it in one atomic step; nothing changes when the id exists.
-- KEYS: job key, jobs index, pending set. ARGV: record JSON, job id, submitted_at, pending score.
-- Returns the pending set's size with the new job in it, or 0 when the id existed.
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
  return redis.call('ZCARD', KEYS[3])
end
return 0
