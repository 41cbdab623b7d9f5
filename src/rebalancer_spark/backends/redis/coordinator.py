"""The Lua scripts of the coordinator: election, resignation and the fenced target
(published whole, or as a change against the stored one).

Same conventions as every script (:mod:`.store.prelude`).
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.store.prelude import PRELUDE

__all__ = ["ELECT", "PUBLISH", "PUBLISH_CHANGE", "RESIGN"]  # the scripts (store/runner.py)

CHANGE_LOG = 64
"""How many published changes of the target the store keeps for the members' views: a member
whose last view is older than that reads its part whole (once)."""

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
# It drops the change log (see PUBLISH_CHANGE) and sets meta 'target_token' to
# '<generation>:<nonce>' (the generation in it: an older version of this library raises the
# generation without touching the token, which then names no current target).
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
for _, x in ipairs(redis.call('SMEMBERS', P .. 'tgens')) do redis.call('DEL', P .. 'tchg:' .. x) end
redis.call('DEL', P .. 'tgens')
redis.call('HSET', META, 'target_epoch', epoch, 'phase', ARGV[3], 'has_target', '1',
  'target_rv', ARGV[4], 'target_token', int(g) .. ':' .. nonce)
notify('publish')
return int(g)
"""
)

# PUBLISH_CHANGE -- publish a target as the difference from generation `base`, as PUBLISH
# does (same fence, same answer), writing only the ids that moved: member i's ids to add were
# staged in the set stage:<nonce>:a<i>, those to remove in stage:<nonce>:d<i>. If the stored
# target is not generation `base`, nothing is written and the caller publishes it whole.
# It also logs the change for the members' views (MEMBER_VIEW): the hash P..'tchg:'..<new
# generation> maps each member whose part changed to the JSON [emptied, added ids, removed
# ids] (emptied = 1 when the member was dropped first), and links the log into a chain: field
# ' base' is the base generation, ' from' the base's meta 'target_token' ('' if that token
# names another generation), ' token' this publication's, which becomes meta's. The set
# P..'tgens' lists the logged generations, the newest CHANGE_LOG (a set, not a sorted set:
# the documented ACL has no sorted-set command). Member ids hold no space, so the three
# fields are no member's.
# KEYS[1] meta
# ARGV    session id, epoch, phase, resources version, nonce, base generation, n,
#         member 1 .. member n, k, dropped member 1 .. dropped member k
# Returns the new generation
# Errors  FENCED as PUBLISH; STALE {generation} if the stored target is not `base`
PUBLISH_CHANGE = (
    PRELUDE
    + f"local CHANGE_LOG = {CHANGE_LOG}\n"
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
local log = {}
for j = 1, k do
  local m = ARGV[8 + n + j]
  redis.call('DEL', P .. 't:' .. m)
  redis.call('SREM', P .. 'tmembers', m)
  log[m] = {1, {}, {}}
end
for i = 1, n do
  local m, t = ARGV[7 + i], P .. 't:' .. ARGV[7 + i]
  redis.call('SADD', P .. 'tmembers', m)
  local d = redis.call('SMEMBERS', stage('d' .. i))
  local a = redis.call('SMEMBERS', stage('a' .. i))
  for _, r in ipairs(d) do redis.call('SREM', t, r) end
  for _, r in ipairs(a) do redis.call('SADD', t, r) end
  if #a > 0 or #d > 0 then log[m] = {log[m] and 1 or 0, a, d} end
end
unstage()
local g2 = int(next_value('generation'))
local entry_key, from = P .. 'tchg:' .. g2, redis.call('HGET', META, 'target_token') or ''
if string.sub(from, 1, #ARGV[6] + 1) ~= ARGV[6] .. ':' then from = '' end
local token = g2 .. ':' .. nonce
redis.call('HSET', entry_key, ' base', ARGV[6], ' from', from, ' token', token)
for m, entry in pairs(log) do redis.call('HSET', entry_key, m, cjson.encode(entry)) end
redis.call('SADD', P .. 'tgens', g2)
local logged = redis.call('SMEMBERS', P .. 'tgens')
if #logged > CHANGE_LOG then
  table.sort(logged, function(x, y) return tonumber(x) < tonumber(y) end)
  for i = 1, #logged - CHANGE_LOG do
    redis.call('SREM', P .. 'tgens', logged[i])
    redis.call('DEL', P .. 'tchg:' .. logged[i])
  end
end
redis.call('HSET', META, 'target_epoch', epoch, 'phase', ARGV[3], 'has_target', '1',
  'target_rv', ARGV[4], 'target_token', token)
notify('publish')
return g2
"""
)
