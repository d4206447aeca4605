"""`tianji pki`: a CA and certificates for a cluster's management plane (tianji.pki), for operators without PKI."""

from __future__ import annotations

from pathlib import Path

import typer

from tianjictl.main import app, console

pki_app = typer.Typer(no_args_is_help=True, help="A CA and certificates for the controller and the hosts (TLS).")
app.add_typer(pki_app, name="pki")


@pki_app.command("issue")
def issue(dir: Path = typer.Argument(..., help="the CA's directory (ca.pem, ca.key; made on first use)"),
          name: str = typer.Argument(..., help="a host's name (its client certificate), or the controller's"),
          server_name: list[str] = typer.Option([], "--server-name",
                                                 help="a server certificate for this DNS name or address "
                                                      "(repeat it: every name clients use to reach the controller)")
          ) -> None:
    """Issue DIR/NAME.pem and DIR/NAME.key (mode 0600), signed by the CA in DIR. A host's certificate names the
    host: with `controller serve --client-ca DIR/ca.pem`, a host's token works only with it."""
    from tianji.pki import Authority

    ca = Authority(dir)
    got = ca.issue(name, server_names=server_name)
    console.print(f"{got.cert} and {got.key}, signed by {ca.cert_path}"
                  + (f" (server names: {', '.join(server_name)})" if server_name else ""))
