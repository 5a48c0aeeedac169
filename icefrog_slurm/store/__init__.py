"""The state store: SQLAlchemy tables and the one place that commits (SQLite and Postgres).

``SqlStore`` (sql.py) opens transactions; ``StoreTx`` (tx.py, ledger.py) is every read and
write; ``records.py`` the immutable records handed out; ``inbox.py`` moves checked job
reports in; ``migrate.py`` runs the alembic migrations of ``db/``.
"""

from icefrog_slurm.store.ledger import StoreError
from icefrog_slurm.store.sql import SqlStore
from icefrog_slurm.store.tx import StoreTx

__all__ = ["SqlStore", "StoreError", "StoreTx"]
