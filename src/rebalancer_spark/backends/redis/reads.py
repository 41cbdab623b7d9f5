"""The reading Lua scripts: one consistent snapshot per call, liveness judged by Redis.

Same conventions as :mod:`.store.prelude` (``KEYS[1]`` is ``rb:{G}:meta``, numbers are decimal
strings). They write nothing, except MEMBER_VIEW noting when a lost group was first seen.
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.store.prelude import PRELUDE

__all__ = [
    "CONTROL",
    "HEAD",
    "HOLDERS",
    "LEASES",
    "MEMBER_HEAD",
    "MEMBER_VIEW",
    "RESOURCES",
    "STATE",
    "TARGET",
]

_MEMBERS = """
local members = {}
local fields = {}
for _, h in ipairs({'info', 'acked', 'leaving', 'static', 'ttl'}) do
  local t, kv = {}, redis.call('HGETALL', P .. h)
  for i = 1, #kv, 2 do t[kv[i]] = kv[i + 1] end
  fields[h] = t
end
local ms = redis.call('HGETALL', P .. 'members')
for i = 1, #ms, 2 do
  local m, sid = ms[i], ms[i + 1]
  if alive(sid) then
    local row = {m, sid, fields.info[m] or '{}', fields.acked[m] or '0',
      fields.leaving[m] or '0', fields.static[m] or '0', fields.ttl[m] or '0'}
    for _, v in ipairs(row) do members[#members + 1] = v end
  end
end
"""
"""Lua: ``members``, the flat rows of the live members (7 values each), from one HGETALL per
member hash rather than one HGET per member and field: the head the coordinator reads after
every claim, release and acknowledgement of a rebalance costs 6 commands, not 6 per member."""

_TARGET = """
local target = {}
for _, m in ipairs(redis.call('SMEMBERS', P .. 'tmembers')) do
  target[#target + 1] = m
  target[#target + 1] = redis.call('SMEMBERS', P .. 't:' .. m)
end
"""
"""Lua: ``target``, {member, {ids}, ...} of the current target."""

_META = """
local meta = redis.call('HGETALL', META)
local control = redis.call('HGETALL', P .. 'control')
if #meta == 0 then return {{}, control} end
"""
"""Lua: ``meta`` and ``control``; a group that does not exist answers ``{{}, control}``."""

# STATE -- the whole group in one atomic read; only members whose lease key exists appear.
# KEYS[1] meta
# ARGV    (none)
# Returns {{}, control} if the group does not exist, else
#         {meta (HGETALL), members {member, session id, info, acked, leaving, static, ttl ms,
#         ...} (live only), resources (HGETALL id -> weight), target {member, {ids}, ...},
#         owner (HGETALL id -> session id), epochs (HGETALL id -> epoch), control}, where
#         control is HGETALL of the control record {version, body} (empty if none)
STATE = (
    PRELUDE
    + _META
    + _MEMBERS
    + _TARGET
    + """
return {meta, members, redis.call('HGETALL', P .. 'resources'), target,
  redis.call('HGETALL', P .. 'owner'), redis.call('HGETALL', P .. 'epochs'), control}
"""
)

# HEAD -- what the coordinator reads on every step: no resource, target or claim.
# KEYS[1] meta
# ARGV    (none)
# Returns {{}, control} if the group does not exist, else {meta, members, control}
HEAD = PRELUDE + _META + _MEMBERS + "return {meta, members, control}\n"

# CONTROL -- the control record alone.
# KEYS[1] meta
# ARGV    (none)
# Returns HGETALL of the control record {version, body} (empty if none)
CONTROL = PRELUDE + "return redis.call('HGETALL', P .. 'control')\n"

# RESOURCES -- the resource set with the meta fields that say which one it is.
# KEYS[1] meta
# ARGV    (none)
# Returns {resources version, incarnation, HGETALL id -> weight}
RESOURCES = (
    PRELUDE
    + """
local v, inc = unpack(redis.call('HMGET', META, 'resources_version', 'inc'))
return {v or '0', inc or '', redis.call('HGETALL', P .. 'resources')}
"""
)

# TARGET -- the current target whole, with the meta fields that describe it.
# KEYS[1] meta
# ARGV    (none)
# Returns {meta (HGETALL), target {member, {ids}, ...}}; meta is empty if there is no group
TARGET = PRELUDE + _TARGET + "return {redis.call('HGETALL', META), target}\n"

# HOLDERS -- which of the given sessions hold at least one claim.
# KEYS[1] meta
# ARGV    session ids
# Returns the session ids among ARGV that own a resource
HOLDERS = (
    PRELUDE
    + """
local out = {}
for _, sid in ipairs(ARGV) do
  for _, r in ipairs(redis.call('SMEMBERS', P .. 'held:' .. sid)) do
    if redis.call('HGET', P .. 'owner', r) == sid then out[#out + 1] = sid; break end
  end
end
return out
"""
)

# MEMBER_VIEW -- one member's part of the target and its claims. Its only write: when the
# session and the whole group are gone, it notes when that was first seen (lost_since).
# The part comes whole, or, when the caller names the part it kept (the incarnation,
# generation and meta 'target_token' it was read at) and the change log (PUBLISH_CHANGE)
# links that generation to the current one unbroken, as the log's entries for this member,
# oldest first: a member's read follows what moved, not its part. Unbroken: each logged
# generation after the kept one names the previous as its base (generation and token), and
# the last is the current generation and token; a publication that wrote no log (a whole one,
# one by an older version of this library) or a store gone back to an older copy breaks it.
# A token that names another generation than meta's (an older version published since) names
# no target: the part comes whole, and the token returned is ''.
# The session's claims come only if asked for ('1'): a member that knows them reads none.
# KEYS[1] meta
# ARGV    session id, claims ('1' or '0'), incarnation, generation, target token of the part
#         the caller kept (the last three '' when it kept none)
# Returns {generation, phase, part, {resource, epoch, ...} held ({} if not asked for),
#         incarnation, coordinator epoch of the target, how, target token}: how '0' when
#         part is the target ids, '1' when it is the log's JSON entries [emptied, added ids,
#         removed ids]
# Errors  EXPIRED {} if the session is not alive
MEMBER_VIEW = (
    PRELUDE
    + """
local sid = ARGV[1]
if not alive(sid) then
  note_if_lost()
  return refuse('EXPIRED', {})
end
local m = redis.call('HGET', P .. 'sessions', sid) or ''
local g, phase, inc, te, token = unpack(redis.call('HMGET', META, 'generation', 'phase', 'inc',
  'target_epoch', 'target_token'))
if not (g and token and string.sub(token, 1, #g + 1) == g .. ':') then token = false end
local kept, part, how = tonumber(ARGV[4]), nil, '1'
if kept and ARGV[3] == inc and token and ARGV[5] ~= '' then
  local gens = {}
  for _, x in ipairs(redis.call('SMEMBERS', P .. 'tgens')) do
    if tonumber(x) > kept and tonumber(x) <= num(g) then gens[#gens + 1] = tonumber(x) end
  end
  table.sort(gens)
  local at, tok, entries = kept, ARGV[5], {}
  for _, x in ipairs(gens) do
    local base, from, own, entry = unpack(redis.call('HMGET', P .. 'tchg:' .. int(x), ' base',
      ' from', ' token', m))
    if tonumber(base) ~= at or from ~= tok then break end
    at, tok = x, own
    if entry then entries[#entries + 1] = entry end
  end
  if at == num(g) and tok == token then part = entries end
end
if not part then part, how = redis.call('SMEMBERS', P .. 't:' .. m), '0' end
local owned = {}
local held = {}
if ARGV[2] == '1' then held = redis.call('SMEMBERS', P .. 'held:' .. sid) end
for i = 1, #held, 1000 do  -- two HMGETs per thousand claims, not two HGETs per claim
  local chunk = {unpack(held, i, math.min(i + 999, #held))}
  local owners = redis.call('HMGET', P .. 'owner', unpack(chunk))
  local epochs = redis.call('HMGET', P .. 'epochs', unpack(chunk))
  for j, r in ipairs(chunk) do
    if owners[j] == sid then
      owned[#owned + 1] = r
      owned[#owned + 1] = epochs[j]
    end
  end
end
return {g or '0', phase or 'running', part, owned, inc or '', te or '0', how, token or ''}
"""
)

# MEMBER_HEAD -- the target fields of MEMBER_VIEW without the ids: O(1).
# KEYS[1] meta
# ARGV    session id
# Returns {generation, phase, coordinator epoch of the target}
# Errors  EXPIRED {} if the session is not alive
MEMBER_HEAD = (
    PRELUDE
    + """
if not alive(ARGV[1]) then
  note_if_lost()
  return refuse('EXPIRED', {})
end
local g, phase, te = unpack(redis.call('HMGET', META, 'generation', 'phase', 'target_epoch'))
return {g or '0', phase or 'running', te or '0'}
"""
)

# LEASES -- what a watch needs to wake at the next expiry: the remaining time of every
# member's lease key, or of the coordinator's alone (what a follower acts on), and of the
# quarantine key (PTTL: -2 when gone).
# KEYS[1] meta
# ARGV    (none) for every member, or 'coordinator'
# Returns {session id, pttl ms, ..., '', quarantine pttl ms}
LEASES = (
    PRELUDE
    + """
local out = {}
if ARGV[1] == 'coordinator' then
  local cs = redis.call('HGET', META, 'coord_sid')
  if cs then out[1] = cs; out[2] = redis.call('PTTL', P .. 'lease:' .. cs) end
else
  local ms = redis.call('HGETALL', P .. 'members')
  for i = 2, #ms, 2 do
    out[#out + 1] = ms[i]
    out[#out + 1] = redis.call('PTTL', P .. 'lease:' .. ms[i])
  end
end
out[#out + 1] = ''
out[#out + 1] = redis.call('PTTL', P .. 'quarantine')
return out
"""
)
