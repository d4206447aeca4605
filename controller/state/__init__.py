"""The controller's state: the tables (`models.py` and the `*_models.py` it gathers), the database and its
migrations (`db.py`, `schema.py`, `migrations/`), the one global revision every write bumps, the reads the
compiles make (`reads.py`: statements built once at import), and what a write records in its own transaction: the
stamps derived from the rows it changed (`stamps.py`), the change log that stands in for NOTIFY on SQLite
(`change_log.py`), the audit log and the idempotency keys.

It imports `tianji` and, of the controller, only its leaves (`errors`, `failpoints`): never the southbound side, the
API, or the process around them (a test holds it, tests/unit/test_layering.py).
"""
