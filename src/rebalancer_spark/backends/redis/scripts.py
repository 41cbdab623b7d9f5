"""The Lua scripts that change a group, one per multi-key operation, each atomic in Redis.

Every script is ``PRELUDE`` + its body. ``KEYS[1]`` is always the group's ``meta`` hash
``rb:{G}:meta``: Redis Cluster routes the call by it, and every other key the script touches is
``P .. suffix`` with ``P = rb:{G}:``, so it hashes to the same slot (see :mod:`.keys`). All
numbers cross the boundary as decimal strings (``int()`` in the prelude formats them) because
Lua numbers are doubles: epochs stay below 2**53 and are exact.

Refusals are error replies ``CODE {json}`` (``EXPIRED``, ``FENCED``, ``INUSE``) that
:mod:`.errors` turns into the library's exceptions with a full message. Scripts that change what
:meth:`Backend.state` shows ``PUBLISH`` on ``rb:{G}:changes``; renewals and commits do not.

Ownership (claim, release, acknowledge, commit) is in :mod:`.ownership`, reads (state,
member view, lease deadlines) in :mod:`.reads`, the shared helpers in :mod:`.prelude`.
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.store.prelude import PRELUDE

__all__ = [
    "ELECT",
    "JOIN",
    "LEAVE",
    "LIFT_EPOCHS",
    "PUBLISH",
    "PUBLISH_CHANGE",
    "RENEW",
    "RESIGN",
    "SET_LEAVING",
    "UPDATE_CONTROL",
    "UPDATE_INFO",
    "UPDATE_RESOURCES",
]

# JOIN -- start a session.
# KEYS[1] meta
# ARGV    member, session id, ttl ms, info JSON, static ('1'|'0'), floor (highest number the
#         client saw, '0' if none), incarnation the client last joined ('' if none),
#         quarantine ttl ms (longest lease the client knows), server uptime s (-1: unknown or
#         the same server process)
# Returns {incarnation, 1 if the floor/quarantine applied else 0}; a floor above the group's
#         high-water mark (Redis went back to an older snapshot) also ends every session of
#         the group and starts a new incarnation (see ensure() in the prelude)
# Errors  INUSE {info, pttl} if a live session of the group has that member id
JOIN = (
    PRELUDE
    + """
local m, sid, ttl = ARGV[1], ARGV[2], ARGV[3]
local inc, evidence = ensure(tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]))
local holder = redis.call('HGET', P .. 'members', m)
if holder and holder ~= sid then
  if alive(holder) then
    return refuse('INUSE', {info = redis.call('HGET', P .. 'info', m) or '{}',
      pttl = redis.call('PTTL', P .. 'lease:' .. holder)})
  end
  drop_session(holder)
end
redis.call('SET', P .. 'lease:' .. sid, m, 'PX', ttl)
redis.call('HSET', P .. 'deadline', sid, int(now_ms() + tonumber(ttl)))
redis.call('HSET', P .. 'members', m, sid)
redis.call('HSET', P .. 'sessions', sid, m)
redis.call('HSET', P .. 'info', m, ARGV[4])
redis.call('HSET', P .. 'ttl', m, ttl)
if ARGV[5] == '1' then redis.call('HSET', P .. 'static', m, '1')
else redis.call('HDEL', P .. 'static', m) end
notify('join')
return {inc, evidence and 1 or 0}
"""
)

# RENEW -- push the lease out to ttl from now (Redis' now: after the request left the member),
# and keep that deadline (P..'deadline') for the grant that may follow its expiry to name.
# When the lease is gone and so is the group, notes when that was first seen (lost_since).
# A caller that saw a number above the group's high-water mark saw a later state than Redis
# holds now (it restarted from an older snapshot): the lease is not renewed, so that the
# member rejoins and its JOIN ends the stale sessions and quarantines the group.
# KEYS[1] meta
# ARGV    session id, ttl ms, floor (highest number the client saw; optional, '0' if none)
# Returns 1
# Errors  EXPIRED {} if the lease key is gone, or the floor is above the high-water mark
RENEW = (
    PRELUDE
    + """
local floor = tonumber(ARGV[3]) or 0
if floor > 0 and redis.call('EXISTS', META) == 1 and floor > high() then
  return refuse('EXPIRED', {})
end
if redis.call('PEXPIRE', P .. 'lease:' .. ARGV[1], ARGV[2]) == 1 then
  redis.call('HSET', P .. 'deadline', ARGV[1], int(now_ms() + tonumber(ARGV[2])))
  return 1
end
note_if_lost()
return refuse('EXPIRED', {})
"""
)

# SET_LEAVING -- mark the session's member as draining.
# KEYS[1] meta
# ARGV    session id
# Returns 1
# Errors  EXPIRED {} if the session is not alive
SET_LEAVING = (
    PRELUDE
    + """
local m = redis.call('HGET', P .. 'sessions', ARGV[1])
if not m or not alive(ARGV[1]) then
  note_if_lost()
  return refuse('EXPIRED', {})
end
redis.call('HSET', P .. 'leaving', m, '1')
notify('leaving')
return 1
"""
)

# UPDATE_INFO -- replace the session's member info (no notification: it wakes nobody).
# KEYS[1] meta
# ARGV    session id, info JSON
# Returns 1
# Errors  EXPIRED {} if the session is not alive
UPDATE_INFO = (
    PRELUDE
    + """
local m = redis.call('HGET', P .. 'sessions', ARGV[1])
if not m or not alive(ARGV[1]) then
  note_if_lost()
  return refuse('EXPIRED', {})
end
redis.call('HSET', P .. 'info', m, ARGV[2])
return 1
"""
)

# LEAVE -- end a session: release its claims and coordinatorship. Idempotent.
# KEYS[1] meta
# ARGV    session id
# Returns 1
LEAVE = (
    PRELUDE
    + """
if drop_session(ARGV[1]) then notify('leave') end
return 1
"""
)

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

# UPDATE_CONTROL -- compare-and-set the group's control record, the hash P..'control'
# {version, body}; version 0 (no hash) is the default record. It does not create the group's
# meta hash: a group may be paused before its first member joins.
# KEYS[1] meta
# ARGV    expected version, record JSON
# Returns {1, new version} if written, {0, stored version} if the version moved on
UPDATE_CONTROL = (
    PRELUDE
    + """
local C = P .. 'control'
local current = num(redis.call('HGET', C, 'version'))
if current ~= tonumber(ARGV[1]) then return {0, int(current)} end
redis.call('HSET', C, 'version', int(current + 1), 'body', ARGV[2])
notify('control')
return {1, int(current + 1)}
"""
)

# UPDATE_RESOURCES -- change the resource set; the version grows only if the set changed.
# The id -> weight pairs to set (replace: the whole new set) were staged (HSET, in the same
# MULTI) in P..'stage:'..nonce..':res', absent when none. 'restore' replaces the set only if
# it is empty and untouched in this incarnation (a client re-declaring the set it last saw
# after Redis lost the group).
# KEYS[1] meta
# ARGV    mode ('replace'|'delta'|'restore'), nonce, floor, incarnation, quarantine ttl ms,
#         server uptime s, ids to remove ...
# Returns the resources version
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
return int(v)
"""
)
