"""The Lua scripts of the resource set: its updates (and its restoration after a loss) and
the lifting of resource epochs to floors.

Same conventions as every script (:mod:`.store.prelude`).
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.store.prelude import PRELUDE

__all__ = ["LIFT_EPOCHS", "UPDATE_RESOURCES"]

# UPDATE_RESOURCES -- change the resource set; the version grows only if the set changed.
# The id -> weight pairs to set (replace: the whole new set) were staged (HSET, in the same
# MULTI) in P..'stage:'..nonce..':res', absent when none. 'restore' replaces the set only if
# it is empty and untouched in this incarnation (a client re-declaring the set it last saw
# after Redis lost the group).
# KEYS[1] meta
# ARGV    mode ('replace'|'delta'|'restore'), nonce, floor, incarnation, quarantine ttl ms,
#         server uptime s, ids to remove ...
# Returns {resources version, 1 if this call changed the set else 0}
UPDATE_RESOURCES = (
    PRELUDE
    + """
local mode, stage, R = ARGV[1], P .. 'stage:' .. ARGV[2] .. ':res', P .. 'resources'
ensure(tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]))
local changed = false
if mode == 'restore' then
  if redis.call('HLEN', R) == 0 and num(redis.call('HGET', META, 'resources_version')) <= base()
  then mode = 'replace' end
end
if mode == 'replace' then
  local new = redis.call('HGETALL', stage)
  if #new / 2 ~= redis.call('HLEN', R) then changed = true
  else
    for i = 1, #new, 2 do
      if redis.call('HGET', R, new[i]) ~= new[i + 1] then changed = true; break end
    end
  end
  if changed then
    redis.call('DEL', R)
    if #new > 0 then redis.call('RENAME', stage, R) end
  end
elseif mode == 'delta' then
  local add = redis.call('HGETALL', stage)
  for i = 1, #add, 2 do
    if redis.call('HGET', R, add[i]) ~= add[i + 1] then
      redis.call('HSET', R, add[i], add[i + 1]); changed = true
    end
  end
  for i = 7, #ARGV do
    if redis.call('HDEL', R, ARGV[i]) == 1 then changed = true end
  end
end
redis.call('DEL', stage)
local v = num(redis.call('HGET', META, 'resources_version'))
if changed then v = next_value('resources_version'); notify('resources') end
return {int(v), changed and 1 or 0}
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
