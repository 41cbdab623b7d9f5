"""The Lua scripts of ownership: claim, release, acknowledge and the fenced progress commit.

Same conventions as :mod:`.scripts`.
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.prelude import PRELUDE

__all__ = ["ACKNOWLEDGE", "CLAIM", "COMMIT", "RELEASE"]

# CLAIM -- grant what is free among the resources the current target gives the caller; a
# grant raises the resource epoch to max(epoch, base) + 1. Nothing is granted while the
# generation differs, the phase is not 'running', or the group is in quarantine.
# KEYS[1] meta
# ARGV    session id, generation, resource 1 .. resource n
# Returns {resource, epoch, 'new'|'held', progress record ('' if none, or if held), ...}:
#         the granted ones, with the progress the new owner resumes from (saving it a round
#         trip), and those this session already holds
# Errors  EXPIRED {} if the session is not alive
CLAIM = (
    PRELUDE
    + """
local sid = ARGV[1]
if not alive(sid) then
  note_if_lost()
  return refuse('EXPIRED', {})
end
local g, phase = unpack(redis.call('HMGET', META, 'generation', 'phase'))
if g ~= ARGV[2] or phase ~= 'running' or redis.call('EXISTS', P .. 'quarantine') == 1 then
  return {}
end
local T = P .. 't:' .. (redis.call('HGET', P .. 'sessions', sid) or '')
local O, E, b = P .. 'owner', P .. 'epochs', base()
local out, granted, top = {}, false, 0
for i = 3, #ARGV do
  local r = ARGV[i]
  if redis.call('SISMEMBER', T, r) == 1 then
    local holder = redis.call('HGET', O, r)
    if holder == sid then
      out[#out + 1] = r; out[#out + 1] = redis.call('HGET', E, r)
      out[#out + 1] = 'held'; out[#out + 1] = ''
    elseif not holder or not alive(holder) then
      local e = int(math.max(num(redis.call('HGET', E, r)), b) + 1)
      top = math.max(top, tonumber(e))
      redis.call('HSET', O, r, sid)
      redis.call('HSET', E, r, e)
      redis.call('SADD', P .. 'held:' .. sid, r)
      if holder then redis.call('SREM', P .. 'held:' .. holder, r) end
      out[#out + 1] = r; out[#out + 1] = e
      out[#out + 1] = 'new'; out[#out + 1] = redis.call('HGET', P .. 'progress', r) or ''
      granted = true
    end
  end
end
if granted then
  raise_high(top)
  notify('claim')
end
return out
"""
)

# RELEASE -- release claims this session holds at exactly the given epochs.
# KEYS[1] meta
# ARGV    session id, resource 1, epoch 1, ..., resource n, epoch n
# Returns 1
RELEASE = (
    PRELUDE
    + """
local sid, changed = ARGV[1], false
for i = 2, #ARGV, 2 do
  local r = ARGV[i]
  if redis.call('HGET', P .. 'owner', r) == sid
    and redis.call('HGET', P .. 'epochs', r) == ARGV[i + 1] then
    redis.call('HDEL', P .. 'owner', r)
    redis.call('SREM', P .. 'held:' .. sid, r)
    changed = true
  end
end
if changed then notify('release') end
return 1
"""
)

# ACKNOWLEDGE -- record that the session's member handled a generation (global barrier).
# KEYS[1] meta
# ARGV    session id, generation
# Returns 1
ACKNOWLEDGE = (
    PRELUDE
    + """
local m = redis.call('HGET', P .. 'sessions', ARGV[1])
if m and redis.call('HGET', P .. 'members', m) == ARGV[1]
  and num(redis.call('HGET', P .. 'acked', m)) < tonumber(ARGV[2]) then
  redis.call('HSET', P .. 'acked', m, ARGV[2])
  raise_high(tonumber(ARGV[2]))
  notify('ack')
end
return 1
"""
)

# COMMIT -- store progress if this live session holds the resource at exactly this epoch.
# KEYS[1] meta
# ARGV    session id, resource, epoch, record ("<epoch>\\n<member>\\n<progress JSON>")
# Returns 1
# Errors  FENCED {holder, epoch, lapsed}: the holder's member id ('' if nobody) and the
#         resource epoch now, lapsed '1' when the claim matches but the lease is gone
COMMIT = (
    PRELUDE
    + """
local sid, r = ARGV[1], ARGV[2]
local holder, e = redis.call('HGET', P .. 'owner', r), redis.call('HGET', P .. 'epochs', r)
if holder ~= sid or e ~= ARGV[3] then
  local hm = holder and alive(holder) and redis.call('HGET', P .. 'sessions', holder)
  return refuse('FENCED', {holder = hm or '', epoch = e or '0', lapsed = '0'})
end
if not alive(sid) then return refuse('FENCED', {holder = '', epoch = e, lapsed = '1'}) end
redis.call('HSET', P .. 'progress', r, ARGV[4])
return 1
"""
)
