-- Compare-and-set job records, each with the release of claims (a pod's exit: its job's record and the pod's
-- slots in one step, so a claim is released exactly when the exit is recorded).
-- ARGV[2] = JSON {"writes": [{"job": <record key>, "claims": [claim keys]}, ...]}; for the i-th write,
-- ARGV[1 + 2i] is the record it expects and ARGV[2 + 2i] the record it writes. Every key named is also in KEYS.
-- Returns {1, {1 | 0, ...}} (per write, in order: written and its claims released, or the record held something
-- else and nothing of that write was done), {-1, key} (nothing done) or {-2, "fenced"}.
if fenced() then
  return {-2, 'fenced'}
end
local req = cjson.decode(ARGV[2])
local checked = {}
for i, w in ipairs(req.writes) do
  if not declared[w.job] then
    return {-1, w.job}
  end
  local claims = {}
  for _, key in ipairs(w.claims) do
    local items = claim_keys_declared(key)
    if items == nil then
      return {-1, key}
    end
    table.insert(claims, {key, items})
  end
  checked[i] = claims
end
local out = {}
for i, w in ipairs(req.writes) do
  if redis.call('GET', w.job) == ARGV[1 + 2 * i] then
    redis.call('SET', w.job, ARGV[2 + 2 * i])
    for _, c in ipairs(checked[i]) do
      release_items(c[1], c[2])
    end
    table.insert(out, 1)
  else
    table.insert(out, 0)
  end
end
return {1, out}
