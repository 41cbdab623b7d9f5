"""How the Redis store works underneath the contract sections: the client and the
script runner, the key layout, the Lua prelude and the decoders, staging of large writes, the
epoch memory.
"""
