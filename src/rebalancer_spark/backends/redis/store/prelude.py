"""The Lua helpers every script starts with, and the conventions of the scripts.

The scripts are one per multi-key operation, each atomic in Redis, in the module of their
contract section (:mod:`..sessions`, :mod:`..coordinator`, :mod:`..resources`,
:mod:`..control`, :mod:`..ownership`, :mod:`..reads`). Every script is ``PRELUDE`` + its body.
``KEYS[1]`` is always the group's ``meta`` hash ``rb:{G}:meta``: Redis Cluster routes the call
by it, and every other key the script touches is ``P .. suffix`` with ``P = rb:{G}:``, so it
hashes to the same slot (see :mod:`.keys`). All numbers cross the boundary as decimal strings
(``int()`` in the prelude formats them) because Lua numbers are doubles: epochs stay below
2**53 and are exact.

Refusals are error replies ``CODE {json}`` (``EXPIRED``, ``FENCED``, ``INUSE``) that
:mod:`..errors` turns into the library's exceptions with a full message. Scripts that change
what :meth:`Backend.state` shows ``PUBLISH`` their kind: on ``rb:{G}:changes`` what every watch
may act on, on ``rb:{G}:coord`` what only the coordinator acts on, and a release also on
``rb:{G}:to:<member>`` for each member it is meant for (see :mod:`..watch`); renewals and
commits publish nothing.
"""

from __future__ import annotations

__all__ = ["PRELUDE"]

# Helpers shared by every script. drop_session(sid) releases the session's claims and
# coordinatorship and removes its lease and member rows; each claim it ends keeps in P..'chain' how
# and when (end_claim: 'released' now while the lease lives, else 'expired' at the lease deadline
# that JOIN and RENEW keep in P..'deadline', Redis TIME in ms); purge() drops every member whose
# lease key is gone; high() is meta's high-water mark: every number the group ever handed out or
# stored (coordinator epoch, generation, resources version, resource epoch, acknowledged
# generation, base) is at most it, and raise_high(v) keeps it so. ensure(floor, seen, ttl, uptime)
# creates the group's meta hash when missing and, when the caller proves it saw an earlier
# incarnation (floor > 0 or a different incarnation id while meta is missing; another incarnation
# id than meta's; or a floor above the high-water mark: Redis went back to an older snapshot, which
# also ends every session of the group and starts a new incarnation), lifts the epoch base above
# max(Redis TIME in us, floor + 1) and calls quarantine(ttl, uptime, went_back): no grants until
# ttl ms after the data was lost. The loss happened before now, before the first time a script
# found the group's meta missing (note_if_lost() keeps that time in P..'lost_since', moved into
# meta when the group is created again; not for a snapshot restored, whose meta is older) and, if
# the server restarted after the caller's last answer from the one before (uptime >= 0: INFO's
# uptime_in_seconds, a difference of whole seconds; see ScriptRunner.server_uptime), before its
# start + 1 s: the earliest of these bounds seen by any caller is kept in P..'quarantine' (hash
# anchor, ttl) which expires at anchor + ttl (see docs/backends/redis.md, "Epochs that never go
# back").
PRELUDE = """
local META = KEYS[1]
local P = string.sub(META, 1, -5)
local function int(n) return string.format('%d', n) end
local function num(v) return tonumber(v) or 0 end
local function alive(sid)
  return sid ~= nil and sid ~= false and redis.call('EXISTS', P .. 'lease:' .. sid) == 1
end
-- what every watch may act on (membership, leases, succession, targets, control, the
-- resource set, which followers remember)
local function notify(what) redis.call('PUBLISH', P .. 'changes', what) end
-- what only the coordinator acts on (claims, releases, acknowledgements, leaving)
local function notify_coordinator(what) redis.call('PUBLISH', P .. 'coord', what) end
-- a release meant for member m (its target holds a released resource)
local function notify_member(m, what) redis.call('PUBLISH', P .. 'to:' .. m, what) end
local function refuse(code, fields)
  return redis.error_reply(code .. ' ' .. cjson.encode(fields))
end
local function base() return num(redis.call('HGET', META, 'base')) end
local function high()
  local h = redis.call('HGET', META, 'high')
  if h then return tonumber(h) end
  if redis.call('EXISTS', META) == 0 then return 0 end
  -- a group written before 'high' was kept: every number it ever showed, once
  local v = 0
  for _, x in ipairs(redis.call('HMGET', META, 'base', 'coord_epoch', 'generation',
    'resources_version')) do v = math.max(v, num(x)) end
  for _, name in ipairs({'epochs', 'acked'}) do
    local kv = redis.call('HGETALL', P .. name)
    for i = 2, #kv, 2 do v = math.max(v, num(kv[i])) end
  end
  redis.call('HSET', META, 'high', int(v))
  return v
end
local function raise_high(v)
  if v > high() then redis.call('HSET', META, 'high', int(v)) end
end
local function next_value(field)
  local v = math.max(num(redis.call('HGET', META, field)), base()) + 1
  redis.call('HSET', META, field, int(v))
  raise_high(v)
  return v
end
local MEMBER_HASHES = {'members', 'info', 'acked', 'leaving', 'static', 'ttl'}
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function end_claim(r, how, at)
  local c = redis.call('HGET', P .. 'chain', r)
  if c then
    local link = cjson.decode(c)
    link.f = how; link.fa = int(at)
    redis.call('HSET', P .. 'chain', r, cjson.encode(link))
  end
end
local function lease_end(sid)
  return tonumber(redis.call('HGET', P .. 'deadline', sid)) or now_ms()
end
local function drop_session(sid)
  local m = redis.call('HGET', P .. 'sessions', sid)
  local how, at = 'released', now_ms()
  if not alive(sid) then how, at = 'expired', math.min(lease_end(sid), at) end
  for _, r in ipairs(redis.call('SMEMBERS', P .. 'held:' .. sid)) do
    if redis.call('HGET', P .. 'owner', r) == sid then
      redis.call('HDEL', P .. 'owner', r)
      end_claim(r, how, at)
    end
  end
  local existed = redis.call('DEL', P .. 'held:' .. sid, P .. 'lease:' .. sid) > 0 or m
  redis.call('HDEL', P .. 'sessions', sid)
  redis.call('HDEL', P .. 'deadline', sid)
  if m and redis.call('HGET', P .. 'members', m) == sid then
    for _, h in ipairs(MEMBER_HASHES) do redis.call('HDEL', P .. h, m) end
  end
  if redis.call('HGET', META, 'coord_sid') == sid then
    redis.call('HDEL', META, 'coord_sid', 'coord_member')
  end
  return existed and true or false
end
local function purge()
  local n = 0
  local ms = redis.call('HGETALL', P .. 'members')
  for i = 2, #ms, 2 do
    if not alive(ms[i]) then drop_session(ms[i]); n = n + 1 end
  end
  return n
end
local function note_if_lost()
  if redis.call('EXISTS', META) == 0 then
    redis.call('SET', P .. 'lost_since', int(now_ms()), 'NX', 'PX', 86400000)
  end
end
local function quarantine(ttl, uptime, went_back)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local anchor = now
  if uptime >= 0 then anchor = math.min(anchor, (tonumber(t[1]) - uptime + 1) * 1000) end
  local lost = tonumber(redis.call('HGET', META, 'lost_since'))
  if lost and not went_back then anchor = math.min(anchor, lost) end
  local q = redis.call('HMGET', P .. 'quarantine', 'anchor', 'ttl')
  if q[1] and went_back then
    -- restored with the old data: it bounds a loss before this one, so keep only its end
    ttl = math.max(ttl, tonumber(q[1]) + tonumber(q[2]) - anchor)
  elseif q[1] then
    anchor = math.min(anchor, tonumber(q[1]))
    ttl = math.max(ttl, tonumber(q[2]))
  end
  if anchor + ttl <= now then return end
  -- every lease of the lost data ran out by anchor + ttl: the next grants supersede them then
  redis.call('HSET', META, 'reset_at', int(anchor + ttl))
  redis.call('HSET', P .. 'quarantine', 'anchor', int(anchor), 'ttl', int(ttl))
  redis.call('PEXPIREAT', P .. 'quarantine', int(anchor + ttl))
  notify('quarantine')
end
local function ensure(floor, seen, ttl, uptime)
  local inc = redis.call('HGET', META, 'inc')
  local evidence, went_back = floor > 0 or seen ~= '', false
  local t = redis.call('TIME')
  if inc then
    evidence = seen ~= '' and seen ~= inc
    if not evidence and floor > high() then
      went_back = true
      -- this incarnation went back (restarted from an older snapshot, a replica behind):
      -- what it shows of sessions and claims may be stale, so end them all, as a total
      -- loss would, and start a new incarnation so that every old member sees it
      evidence = true
      local ss = redis.call('HGETALL', P .. 'sessions')
      for i = 1, #ss, 2 do drop_session(ss[i]) end
      local ms = redis.call('HGETALL', P .. 'members')
      for i = 2, #ms, 2 do drop_session(ms[i]) end
      for _, h in ipairs(MEMBER_HASHES) do redis.call('DEL', P .. h) end
      redis.call('DEL', P .. 'owner', P .. 'sessions')
      redis.call('HDEL', META, 'coord_sid', 'coord_member')
      inc = t[1] .. '.' .. t[2]
      redis.call('HSET', META, 'inc', inc)
      redis.call('HDEL', META, 'lost_since')
      notify('leave')
    end
  end
  if not inc then
    inc = t[1] .. '.' .. t[2]
    redis.call('HSET', META, 'inc', inc, 'base', '0', 'high', '0', 'coord_epoch', '0',
      'generation', '0', 'resources_version', '0', 'phase', 'running', 'has_target', '0',
      'target_epoch', '0', 'target_rv', '0')
    local lost = redis.call('GET', P .. 'lost_since')
    if lost then
      redis.call('HSET', META, 'lost_since', lost)
      redis.call('DEL', P .. 'lost_since')
    end
  end
  if evidence then
    redis.call('HSET', META, 'reset_at', int(now_ms()))
    local b = math.max(tonumber(t[1]) * 1000000 + tonumber(t[2]), floor + 1)
    if b > base() then redis.call('HSET', META, 'base', int(b)) end
    raise_high(b)
    if ttl > 0 then quarantine(ttl, uptime, went_back) end
  end
  return inc, evidence
end
"""
