"""The Lua scripts of sessions: join (with the checks of a store that lost the group),
renew, the drain mark, the published info, leave.

Same conventions as every script (:mod:`.store.prelude`).
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.store.prelude import PRELUDE

__all__ = ["JOIN", "LEAVE", "RENEW", "SET_LEAVING", "UPDATE_INFO"]

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
notify_coordinator('leaving')
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
