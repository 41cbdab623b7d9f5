"""The runtime: a member node on background threads (heartbeat, coordinator, reconciler)."""

from rebalancer_spark.member.node import (
    Member,
    MemberState,
    OwnedResource,
    default_backend_url,
    join,
)

__all__ = ["Member", "MemberState", "OwnedResource", "default_backend_url", "join"]
