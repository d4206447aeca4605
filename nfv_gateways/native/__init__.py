"""The gateway's native code: the C sources, their interface in `include/` (stated once, read by `api.py`), and
the packet loop's binding (`dataplane.py`). Every role's C stage lives here beside the loop; a role's own binding
of its stage is in its package (`roles/<role>/native.py`)."""
