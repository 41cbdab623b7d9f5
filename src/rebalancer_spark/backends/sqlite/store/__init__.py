"""How the SQLite store works underneath the contract sections: the connection and
its errors, the schema, the group's change counter, the epoch chain's clock.
"""
