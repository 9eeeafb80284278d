-- What the metrics poll reads: hashes whole (the family weights, the nodes' used hashes), then claims' allocations.
-- A pipeline of single commands costs its client a reply to parse per command (two thousand at 1,000 nodes and
-- 800 running pods); a call of this script answers a whole chunk of them in one reply. Reads only.
-- KEYS: ARGV[1] hashes read whole, then claims.
-- Returns: per key, in order: a hash's flat field/value list, or a claim's alloc (false: the claim is gone).
local hashes = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  if i <= hashes then
    out[i] = redis.call('HGETALL', KEYS[i])
  else
    out[i] = redis.call('HGET', KEYS[i], 'alloc')
  end
end
return out
