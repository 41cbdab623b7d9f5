"""The Lua scripts of ownership: claim, release, acknowledge and the fenced progress commit.

Same conventions as :mod:`.store.prelude`.
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.store.prelude import PRELUDE

__all__ = ["ACKNOWLEDGE", "CLAIM", "COMMIT", "RELEASE"]

# CLAIM -- grant what is free among the resources the current target gives the caller; a
# grant raises the resource epoch to max(epoch, base) + 1. Nothing is granted while the
# generation differs, the phase is not 'running', or the group is in quarantine. Each grant
# records its link of the epoch chain in P..'chain' (resource -> JSON {m, s, e: the holder,
# its session and epoch; pm, ps, pe, pf, pfa: what the grant superseded; f, fa: how and when
# the holding ended, set by RELEASE and drop_session}); pe is absent when the epoch was lifted
# to the base (the store lost its records), pfa is in ms of Redis TIME (answered as an age).
# KEYS[1] meta
# ARGV    session id, generation, resource 1 .. resource n
# Returns {resource, epoch, 'new'|'held', progress record ('' if none),
#          prev member, prev session, prev epoch, freed, ms since freed ('' where unknown), ...}:
#         the granted ones, with the progress the new owner resumes from (the grant hands
#         it over: no second request) and what the grant superseded, and those this session
#         already holds
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
local O, E, C, b = P .. 'owner', P .. 'epochs', P .. 'chain', base()
local me = redis.call('HGET', P .. 'sessions', sid) or ''
local out, granted, top = {}, false, 0
local now = now_ms()
local live = {}  -- holder session -> alive: read once per holder, not once per resource
local function holder_alive(h)
  if live[h] == nil then live[h] = alive(h) end
  return live[h]
end
local function link_out(l)
  out[#out + 1] = l.pm or ''; out[#out + 1] = l.ps or ''; out[#out + 1] = l.pe or ''
  -- the predecessor's end as an age (ms before this answer), not a time on Redis' clock: the
  -- member puts it on its own clock, so a stepped Redis clock does not move it
  out[#out + 1] = l.pf or ''; out[#out + 1] = l.pfa and int(now - tonumber(l.pfa)) or ''
end
for i = 3, #ARGV do
  local r = ARGV[i]
  if redis.call('SISMEMBER', T, r) == 1 then
    local holder = redis.call('HGET', O, r)
    if holder == sid then
      local c = redis.call('HGET', C, r)
      local l = c and cjson.decode(c) or {}
      if l.s ~= sid then l = {} end
      out[#out + 1] = r; out[#out + 1] = redis.call('HGET', E, r)
      out[#out + 1] = 'held'; out[#out + 1] = redis.call('HGET', P .. 'progress', r) or ''
      link_out(l)
    elseif not holder or not holder_alive(holder) then
      local stored = redis.call('HGET', E, r)
      local last = math.max(num(stored), b)
      local e = int(last + 1)
      local c = redis.call('HGET', C, r)
      local prev = c and cjson.decode(c) or {}
      local l = {m = me, s = sid, e = e}
      if b > num(stored) and b > 0 then
        -- lifted to the base: the records it would supersede were lost with Redis' data
        l.pf = 'expired'; l.pfa = redis.call('HGET', META, 'reset_at') or int(now_ms())
      elseif not stored then
        l.pe = '0'; l.pf = 'new'
      elseif prev.e ~= stored then
        l.pe = stored  -- a record written before the chain was kept: predecessor unknown
      elseif holder then
        l.pm = prev.m; l.ps = holder; l.pe = stored; l.pf = 'expired'
        l.pfa = int(math.min(lease_end(holder), now_ms()))
      else
        l.pm = prev.m; l.ps = prev.s; l.pe = stored; l.pf = prev.f; l.pfa = prev.fa
      end
      top = math.max(top, tonumber(e))
      redis.call('HSET', O, r, sid)
      redis.call('HSET', E, r, e)
      redis.call('HSET', C, r, cjson.encode(l))
      redis.call('SADD', P .. 'held:' .. sid, r)
      if holder then redis.call('SREM', P .. 'held:' .. holder, r) end
      out[#out + 1] = r; out[#out + 1] = e
      out[#out + 1] = 'new'; out[#out + 1] = redis.call('HGET', P .. 'progress', r) or ''
      link_out(l)
      granted = true
    end
  end
end
if granted then
  raise_high(top)
  notify_coordinator('claim')
end
return out
"""
)

# RELEASE -- release claims this session holds at exactly the given epochs; each keeps in
# P..'chain' that it was released, and when (Redis TIME, ms). The message names the members
# whose target holds a released resource ('release m3 m7', on the coordinator's channel) and
# goes to each of them on its own channel ('release m3' on P..'to:m3'): only they (and the
# coordinator) receive it. Finding them costs one SISMEMBER per resource and member named so
# far, then one per other target member until its receiver is found: a join's releases, all
# for the member that joined, cost about one each (at 100 members the scan of every member cost
# about 50 per resource).
# KEYS[1] meta
# ARGV    session id, resource 1, epoch 1, ..., resource n, epoch n
# Returns 1
RELEASE = (
    PRELUDE
    + """
local sid, changed, now = ARGV[1], false, now_ms()
local targeted, to, names = nil, {}, {}
for i = 2, #ARGV, 2 do
  local r = ARGV[i]
  if redis.call('HGET', P .. 'owner', r) == sid
    and redis.call('HGET', P .. 'epochs', r) == ARGV[i + 1] then
    redis.call('HDEL', P .. 'owner', r)
    end_claim(r, 'released', now)
    redis.call('SREM', P .. 'held:' .. sid, r)
    changed = true
    targeted = targeted or redis.call('SMEMBERS', P .. 'tmembers')
    -- the members named so far first: a join's releases all go to the member that joined
    local found = false
    for _, m in ipairs(names) do
      if redis.call('SISMEMBER', P .. 't:' .. m, r) == 1 then found = true; break end
    end
    if not found then
      for _, m in ipairs(targeted) do
        if not to[m] and redis.call('SISMEMBER', P .. 't:' .. m, r) == 1 then
          to[m] = true; names[#names + 1] = m
          break
        end
      end
    end
  end
end
if changed then
  notify_coordinator(#names > 0 and 'release ' .. table.concat(names, ' ') or 'release')
  for _, m in ipairs(names) do notify_member(m, 'release ' .. m) end
end
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
  notify_coordinator('ack')
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
