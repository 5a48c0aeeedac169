"""The state store: SQLAlchemy tables and the one place that commits (SQLite and Postgres)."""
