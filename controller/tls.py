"""The controller's side of TLS: the server context (reloadable in place), and who a client's certificate names.

`--tls-cert/--tls-key` serve HTTPS; `--client-ca` verifies the certificates clients present (a certificate from
another CA fails the handshake), and a host's credential is then accepted only with a certificate naming that host
(`controller.guards`): a stolen token alone no longer acts as a hypervisor. Tenants and the admin need no
certificate. SIGHUP reloads the certificate and key from the same files: new connections get the new certificate,
the watches already open stay up (docs/security.md, rotation)."""

from __future__ import annotations

import logging
import ssl
import weakref
from typing import Any

log = logging.getLogger("tianji.controller")

# this process's server contexts, for SIGHUP (weakly: a server that stopped takes its context with it)
_CONTEXTS: list[tuple[weakref.ref[ssl.SSLContext], str, str]] = []


def server_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """TLS 1.2 at least; with `client_ca`, client certificates verified when presented (CERT_OPTIONAL: tenants
    have none; hosts must, which the guard enforces per credential)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    _CONTEXTS[:] = [c for c in _CONTEXTS if c[0]() is not None]
    _CONTEXTS.append((weakref.ref(ctx), cert, key))
    return ctx


def uvicorn_factory(cert: str, key: str, client_ca: str | None, _config: Any, _default: Any) -> ssl.SSLContext:
    """uvicorn's `ssl_context_factory` (module level and bound with functools.partial: workers unpickle it)."""
    return server_context(cert, key, client_ca)


def reload_certificates() -> int:
    """Loads each context's certificate and key again (a rotation); how many. A bad file leaves that context as
    it was, and says so."""
    done = 0
    for ref, cert, key in _CONTEXTS:
        if (ctx := ref()) is None:
            continue
        try:
            ctx.load_cert_chain(cert, key)
            done += 1
        except (OSError, ssl.SSLError) as e:
            log.error("certificate reload from %s / %s failed (%s): still serving the previous one", cert, key, e)
    if done:
        log.warning("reloaded the TLS certificate from %s", ", ".join(sorted({c for _, c, _ in _CONTEXTS})))
    return done


def peer_names(peercert: dict | None) -> tuple[str, ...]:
    """The names a verified client certificate carries: its DNS subject alternative names, else its common name."""
    if not peercert:
        return ()
    dns = tuple(v for k, v in peercert.get("subjectAltName", ()) if k == "DNS")
    if dns:
        return dns
    return tuple(v for rdn in peercert.get("subject", ()) for k, v in rdn if k == "commonName")
