"""Suite-wide fixtures: the databases (SQLite and a real Postgres, one server a session)."""

pytest_plugins = ["tests.support.databases"]
