"""Certificates made in the test (trustme): a CA, a server certificate and a client certificate."""

from __future__ import annotations

from pathlib import Path

import trustme

from eventlog.tls import TlsFiles


class Pki:
    """A CA, the server's certificate (127.0.0.1, localhost) and a client's, as PEM files in `root`."""

    def __init__(self, root: Path, name: str) -> None:
        self.ca_authority = trustme.CA()
        self.ca = root / f"{name}-ca.pem"
        self.ca_authority.cert_pem.write_to_path(str(self.ca))
        self.cert, self.key = self.issue(root, f"{name}-server", "127.0.0.1", "localhost")
        self.client_cert, self.client_key = self.issue(root, f"{name}-client", "shoal-client")

    def issue(self, root: Path, name: str, *identities: str) -> tuple[Path, Path]:
        issued = self.ca_authority.issue_cert(*identities)
        cert, key = root / f"{name}.pem", root / f"{name}-key.pem"
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        return cert, key

    def server_files(self, *, verify_clients: bool) -> TlsFiles:
        return TlsFiles(ca=str(self.ca) if verify_clients else "", cert=str(self.cert), key=str(self.key))

    def client_files(self, *, with_cert: bool = False) -> TlsFiles:
        if not with_cert:
            return TlsFiles(ca=str(self.ca))
        return TlsFiles(ca=str(self.ca), cert=str(self.client_cert), key=str(self.client_key))
