"""The Lua scripts of the coordinator: election, resignation and the fenced target
(published whole, or as a change against the stored one).

Same conventions as every script (:mod:`.store.prelude`).
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.store.prelude import PRELUDE

__all__ = ["ELECT", "PUBLISH", "PUBLISH_CHANGE", "RESIGN"]

# ELECT -- take the coordinator role if vacant, raising the coordinator epoch by one; first
# drops every member whose lease key has expired (releasing their claims).
# KEYS[1] meta
# ARGV    session id
# Returns {member, session id, epoch} of the coordinator after the attempt, or nil if the
#         caller's own session is not alive
ELECT = (
    PRELUDE
    + """
local sid = ARGV[1]
if not alive(sid) then return false end
local dropped = purge()
local cm, cs, ce = unpack(redis.call('HMGET', META, 'coord_member', 'coord_sid', 'coord_epoch'))
if cs and cm and alive(cs) and redis.call('HGET', P .. 'members', cm) == cs then
  if dropped > 0 then notify('expired') end
  return {cm, cs, ce}
end
local m = redis.call('HGET', P .. 'sessions', sid)
if not m then return false end
local e = next_value('coord_epoch')
redis.call('HSET', META, 'coord_member', m, 'coord_sid', sid)
notify('elect')
return {m, sid, int(e)}
"""
)

# RESIGN -- give up the coordinator role if held by this session at this epoch.
# KEYS[1] meta
# ARGV    session id, epoch
# Returns 1
RESIGN = (
    PRELUDE
    + """
local cs, ce = unpack(redis.call('HMGET', META, 'coord_sid', 'coord_epoch'))
if cs == ARGV[1] and ce == ARGV[2] then
  redis.call('HDEL', META, 'coord_sid', 'coord_member')
  notify('resign')
end
return 1
"""
)

# PUBLISH -- replace the target, fenced by the coordinator epoch and session. The target of
# member i was staged (SADD, in the same MULTI) in P..'stage:'..nonce..':'..i, absent when
# empty; the script renames each onto P..'t:'..member, so no argument grows with the target.
# KEYS[1] meta
# ARGV    session id, epoch, phase, resources version, nonce, n, member 1 .. member n
# Returns the new generation
# Errors  FENCED {member, epoch, alive} (current coordinator member and epoch; '1' if the
#         caller's session is alive); the staged keys are deleted
PUBLISH = (
    PRELUDE
    + """
local sid, epoch, nonce, n = ARGV[1], ARGV[2], ARGV[5], tonumber(ARGV[6])
local function stage(i) return P .. 'stage:' .. nonce .. ':' .. i end
local cm, cs, ce = unpack(redis.call('HMGET', META, 'coord_member', 'coord_sid', 'coord_epoch'))
if cs ~= sid or ce ~= epoch or not alive(sid) then
  for i = 1, n do redis.call('DEL', stage(i)) end
  return refuse('FENCED', {member = cm or '', epoch = ce or '0',
    alive = alive(sid) and '1' or '0'})
end
purge()
for _, m in ipairs(redis.call('SMEMBERS', P .. 'tmembers')) do redis.call('DEL', P .. 't:' .. m) end
redis.call('DEL', P .. 'tmembers')
for i = 1, n do
  local m = ARGV[6 + i]
  redis.call('SADD', P .. 'tmembers', m)
  if redis.call('EXISTS', stage(i)) == 1 then redis.call('RENAME', stage(i), P .. 't:' .. m) end
end
local g = next_value('generation')
redis.call('HSET', META, 'target_epoch', epoch, 'phase', ARGV[3], 'has_target', '1',
  'target_rv', ARGV[4])
notify('publish')
return int(g)
"""
)

# PUBLISH_CHANGE -- publish a target as the difference from generation `base`, as PUBLISH
# does (same fence, same answer), writing only the ids that moved: member i's ids to add were
# staged in the set stage:<nonce>:a<i>, those to remove in stage:<nonce>:d<i>. If the stored
# target is not generation `base`, nothing is written and the caller publishes it whole.
# KEYS[1] meta
# ARGV    session id, epoch, phase, resources version, nonce, base generation, n,
#         member 1 .. member n, k, dropped member 1 .. dropped member k
# Returns the new generation
# Errors  FENCED as PUBLISH; STALE {generation} if the stored target is not `base`
PUBLISH_CHANGE = (
    PRELUDE
    + """
local sid, epoch, nonce, n = ARGV[1], ARGV[2], ARGV[5], tonumber(ARGV[7])
local k = tonumber(ARGV[8 + n])
local function stage(x) return P .. 'stage:' .. nonce .. ':' .. x end
local function unstage()
  for i = 1, n do redis.call('DEL', stage('a' .. i), stage('d' .. i)) end
end
local cm, cs, ce = unpack(redis.call('HMGET', META, 'coord_member', 'coord_sid', 'coord_epoch'))
if cs ~= sid or ce ~= epoch or not alive(sid) then
  unstage()
  return refuse('FENCED', {member = cm or '', epoch = ce or '0',
    alive = alive(sid) and '1' or '0'})
end
local g, has = unpack(redis.call('HMGET', META, 'generation', 'has_target'))
if has ~= '1' or g ~= ARGV[6] then
  unstage()
  return refuse('STALE', {generation = g or '0'})
end
purge()
for j = 1, k do
  local m = ARGV[8 + n + j]
  redis.call('DEL', P .. 't:' .. m)
  redis.call('SREM', P .. 'tmembers', m)
end
for i = 1, n do
  local m, t = ARGV[7 + i], P .. 't:' .. ARGV[7 + i]
  redis.call('SADD', P .. 'tmembers', m)
  for _, r in ipairs(redis.call('SMEMBERS', stage('d' .. i))) do redis.call('SREM', t, r) end
  for _, r in ipairs(redis.call('SMEMBERS', stage('a' .. i))) do redis.call('SADD', t, r) end
end
unstage()
local g2 = next_value('generation')
redis.call('HSET', META, 'target_epoch', epoch, 'phase', ARGV[3], 'has_target', '1',
  'target_rv', ARGV[4])
notify('publish')
return int(g2)
"""
)
