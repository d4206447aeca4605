"""How every client (agent, gateway, CLI) verifies the controller and proves who it is: one place.

The controller is verified against `ca` (a PEM file: the cluster's CA) or, without one, the system's store; a host
presents `cert`/`key` when given them (the controller then checks the certificate names the host its token acts
for). Defaults come from TIANJI_CA, TIANJI_CERT and TIANJI_KEY."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class ClientTls:
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @classmethod
    def from_env(cls, ca: str | None = None, cert: str | None = None, key: str | None = None) -> ClientTls:
        return cls(ca or os.environ.get("TIANJI_CA") or None, cert or os.environ.get("TIANJI_CERT") or None,
                   key or os.environ.get("TIANJI_KEY") or None)

    def context(self) -> ssl.SSLContext:
        """Verifies the server's certificate and name (TLS 1.2 at least), with our certificate if we have one."""
        ctx = ssl.create_default_context(cafile=self.ca) if self.ca else ssl.create_default_context()
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


def split_urls(urls: str | list[str]) -> list[str]:
    """`--controller URL[,URL...]` (TIANJI_URL alike): the replicas a client may use, in order of preference."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    out = [u.strip().rstrip("/") for u in items if u.strip()]
    if not out:
        raise ValueError("no controller URL given")
    if bad := [u for u in out if not u.startswith(("http://", "https://"))]:
        raise ValueError(f"controller URL(s) {bad} must start with https:// (or http:// where the controller runs "
                         "with --insecure-http)")
    return out
