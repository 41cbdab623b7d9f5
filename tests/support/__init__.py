"""What the tests share and that is not a test: waiting on conditions, member processes, the
chaos runner and its invariants, audit tables, Spark job harnesses."""
