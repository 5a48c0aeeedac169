"""The state store: SQLAlchemy tables and the one place that commits (SQLite and Postgres).

``sql.py`` (``SqlStore``) opens transactions; ``tx.py`` and ``ledger.py`` (``SqlStoreTx``) are
every read and write, returning the domain's immutable records (icefrog_slurm.domain);
``views.py`` the reports' reads; ``inbox.py`` moves checked job reports in; ``leader.py``
the one active controller's lock and lease; ``migrate.py`` runs the alembic migrations.
Importing this package loads nothing: import the module you need.
"""
