"""How the ZooKeeper store works underneath the contract sections: the shared client
and each member's own connection, the tree's layout and records, multi-ops and fences,
multiRead.
"""
