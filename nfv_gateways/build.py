"""`python -m nfv_gateways.build`: compile the gateway's native code for this machine (run by `make setup`).

native/Makefile does the building; this reports it: the NAT stage alone (_nat_fp.so) and one data-plane library per
packet-I/O backend this machine supports.
A backend whose development files are missing is reported, not fatal: `--fastpath auto` uses what was built.
"""

from __future__ import annotations

import sys

from nfv_gateways.native import api, dataplane
from nfv_gateways.roles.nat import native as nat_native


def main() -> int:
    print(f"==> NAT fast path: {api.build(nat_native.LIB)}")
    failed = False
    for backend, result in dataplane.build_all().items():
        print(f"==> gateway data plane {backend:<6} {result}")
        failed |= result.startswith("unavailable") and backend == "packet"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
