"""The gateway roles, one package each: `role.py` (the `core.role.Role` the instance is handed), `reference.py`
(the Python semantics), `native.py` (the binding of its C stage), and what else the role needs."""
