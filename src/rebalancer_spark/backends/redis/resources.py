"""The Lua scripts of the resource set: its updates (and its restoration after a loss) and
the lifting of resource epochs to floors.

Same conventions as every script (:mod:`.store.prelude`).
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.store.prelude import PRELUDE

__all__ = ["LIFT_EPOCHS", "RESOURCE_CHANGES", "UPDATE_RESOURCES"]

# UPDATE_RESOURCES -- change the resource set; the version grows only if the set changed.
# The id -> weight pairs to set (replace: the whole new set) were staged (HSET, in the same
# MULTI) in P..'stage:'..nonce..':res', absent when none. 'restore' replaces the set only if
# it is empty and untouched in this incarnation (a client re-declaring the set it last saw
# after Redis lost the group).
# Each change is logged (RESOURCE_CHANGES reads the log): the set 'rlog' holds the logged
# versions (sorted here: the minimal ACL has no list or sorted-set command),
# 'rlog:<v>' holds the ids version v put (id -> weight) or removed (id -> ''), meta 'rlog_from'
# and 'rlog_upto' the versions the log covers (after the one, up to the other: a client of an
# earlier release that changes the set logs nothing, and leaves 'rlog_upto' behind), and
# 'rlog_n' how many ids the log holds.
# A change of more ids than the limit (ARGV[7], or the set's size over ARGV[8] if that is
# more: base.resource_log_limit) or a restoration empties the log; the oldest changes are
# dropped beyond ARGV[9] versions or the limit.
# KEYS[1] meta
# ARGV    mode ('replace'|'delta'|'change'|'restore'), nonce, floor, incarnation, quarantine
#         ttl ms, server uptime s, log ids, log share, log versions, base ('change': a delta
#         applied only if the set is still at that version), ids to remove ...
# Returns {resources version, 1 if this call changed the set else 0, 1 if 'change' found the
#         set at another version than base (nothing done) else 0}
UPDATE_RESOURCES = (
    PRELUDE
    + """
local mode, stage, R = ARGV[1], P .. 'stage:' .. ARGV[2] .. ':res', P .. 'resources'
local versions = tonumber(ARGV[9])
ensure(tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]))
local put, gone, restored = {}, {}, false
if mode == 'change' then
  local at = num(redis.call('HGET', META, 'resources_version'))
  if at ~= tonumber(ARGV[10]) then
    redis.call('DEL', stage)
    return {int(at), 0, 1}
  end
  mode = 'delta'
end
if mode == 'restore' then
  if redis.call('HLEN', R) == 0 and num(redis.call('HGET', META, 'resources_version')) <= base()
  then mode = 'replace'; restored = true end
end
if mode == 'replace' then
  local new, old, had, wanted = redis.call('HGETALL', stage), redis.call('HGETALL', R), {}, {}
  for i = 1, #old, 2 do had[old[i]] = old[i + 1] end
  for i = 1, #new, 2 do
    wanted[new[i]] = true
    if had[new[i]] ~= new[i + 1] then put[#put + 1] = {new[i], new[i + 1]} end
  end
  for i = 1, #old, 2 do
    if not wanted[old[i]] then gone[#gone + 1] = old[i] end
  end
  if #put + #gone > 0 then
    redis.call('DEL', R)
    if #new > 0 then redis.call('RENAME', stage, R) end
  end
elseif mode == 'delta' then
  local add = redis.call('HGETALL', stage)
  for i = 1, #add, 2 do
    if redis.call('HGET', R, add[i]) ~= add[i + 1] then
      redis.call('HSET', R, add[i], add[i + 1]); put[#put + 1] = {add[i], add[i + 1]}
    end
  end
  for i = 11, #ARGV do
    if redis.call('HDEL', R, ARGV[i]) == 1 then gone[#gone + 1] = ARGV[i] end
  end
end
redis.call('DEL', stage)
local changed = #put + #gone > 0
local v = num(redis.call('HGET', META, 'resources_version'))
if changed then
  -- A hole in the log: a change an older client made without logging, or a version that
  -- jumped (to the base, after a loss or a return to an older copy): versions skipped must
  -- not read as covered.
  local before = v
  v = next_value('resources_version'); notify('resources')
  local hole = num(redis.call('HGET', META, 'rlog_upto')) ~= before or v ~= before + 1
    or not redis.call('HGET', META, 'rlog_from')
  redis.call('HSET', META, 'rlog_upto', int(v))
  local L = P .. 'rlog'
  local limit = math.max(tonumber(ARGV[7]), math.floor(redis.call('HLEN', R) / tonumber(ARGV[8])))
  local n = num(redis.call('HGET', META, 'rlog_n'))
  local logged = redis.call('SMEMBERS', L)
  table.sort(logged, function(a, b) return tonumber(a) < tonumber(b) end)
  if restored or hole or #put + #gone > limit then
    for _, old in ipairs(logged) do redis.call('DEL', L .. ':' .. old) end
    redis.call('DEL', L)
    redis.call('HSET', META, 'rlog_from', int(v), 'rlog_n', '0')
  else
    local entry = L .. ':' .. int(v)
    for _, p in ipairs(put) do redis.call('HSET', entry, p[1], p[2]) end
    for _, id in ipairs(gone) do redis.call('HSET', entry, id, '') end
    n = n + redis.call('HLEN', entry)
    redis.call('SADD', L, int(v))
    local count, first = #logged + 1, 1
    while (count > versions or n > limit) and first <= #logged do
      local old = logged[first]
      n = n - redis.call('HLEN', L .. ':' .. old)
      redis.call('DEL', L .. ':' .. old)
      redis.call('SREM', L, old)
      redis.call('HSET', META, 'rlog_from', old)
      first, count = first + 1, count - 1
    end
    redis.call('HSET', META, 'rlog_n', int(n))
  end
end
return {int(v), changed and 1 or 0, 0}
"""
)

# RESOURCE_CHANGES -- the logged changes of the resource set after a version.
# KEYS[1] meta
# ARGV    since
# Returns {resources version, incarnation, 1 if the log reaches back to since else 0,
#          {id, weight or '' (removed), ...} of each later version, oldest first}
RESOURCE_CHANGES = (
    PRELUDE
    + """
local since = tonumber(ARGV[1])
local v, inc, from, upto = unpack(redis.call('HMGET', META, 'resources_version', 'inc',
  'rlog_from', 'rlog_upto'))
v = num(v)
if since < num(from) or since > v or num(upto) ~= v then return {int(v), inc or '', 0, {}} end
local out, L = {}, P .. 'rlog'
local logged = redis.call('SMEMBERS', L)
table.sort(logged, function(a, b) return tonumber(a) < tonumber(b) end)
for _, k in ipairs(logged) do
  if tonumber(k) > since then out[#out + 1] = redis.call('HGETALL', L .. ':' .. k) end
end
return {int(v), inc or '', 1, out}
"""
)

# LIFT_EPOCHS -- raise the epoch of resources nobody holds to a floor (epochs known to a member
#         or recorded durably elsewhere, after the group lost its data: backends/base.py).
# KEYS[1] meta
# ARGV    resource, floor, resource, floor, ...
# Returns how many epochs were raised (0 if the group does not exist); raises high with them
LIFT_EPOCHS = (
    PRELUDE
    + """
if redis.call('EXISTS', META) == 0 then return 0 end
local lifted, b = 0, base()
for i = 1, #ARGV, 2 do
  local r, f = ARGV[i], tonumber(ARGV[i + 1])
  if f > b and not redis.call('HGET', P .. 'owner', r)
      and num(redis.call('HGET', P .. 'epochs', r)) < f then
    redis.call('HSET', P .. 'epochs', r, int(f))
    raise_high(f)
    lifted = lifted + 1
  end
end
if lifted > 0 then notify('lift') end
return lifted
"""
)
