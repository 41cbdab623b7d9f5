"""The Lua script of the operator's control record (a compare-and-set on its version).

Same conventions as every script (:mod:`.store.prelude`).
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.store.prelude import PRELUDE

__all__ = ["UPDATE_CONTROL"]

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
