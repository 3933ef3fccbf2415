"""`shoal nats certs`: a private CA and one certificate per host, for a home cluster's TLS.

A NATS server off loopback serves TLS or nothing (`services.nats.PlaintextOffLoopback`); this
makes what it needs without openssl: `ca.pem` (every host's `nats_tls_ca`), and for each host
`<host>.pem` + `<host>-key.pem` (its `nats_tls_cert` and `nats_tls_key`), valid for that host's
name or address, for serving (a NATS server) and as a client (mutual TLS). The CA's key,
`ca-key.pem`, signs more hosts later: keep it off the cluster. Keys are 0600 in a 0700 directory.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.credentials import private_dir, write_secret

CA_DAYS = 3650
HOST_DAYS = 825  # the longest a client such as a browser accepts; renew by running it again
CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"


def host_files(host: str) -> tuple[str, str]:
    """The certificate's and key's file names of `host`."""
    return f"{host}.pem", f"{host}-key.pem"


def write_certs(out: Path, hosts: Sequence[str], now: datetime.datetime | None = None) -> dict[str, Path]:
    """A new CA and a certificate for each of `hosts` (a DNS name or an IP address) in the new
    directory `out`; file name -> path. `ValueError` if `out` exists or no host is given."""
    if not hosts:
        raise ValueError("give at least one host: a name or address clients connect to")
    if out.exists():
        raise ValueError(f"{out} exists; choose a new directory")
    start = now or datetime.datetime.now(datetime.UTC)
    private_dir(out)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shoal NATS CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), start, CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(sign_certs=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    written = {CA_CERT: _write(out / CA_CERT, ca.public_bytes(serialization.Encoding.PEM), secret=False)}
    written[CA_KEY] = _write(out / CA_KEY, _pem_key(ca_key), secret=True)
    for host in hosts:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
        cert = (
            _builder(name, ca_name, key.public_key(), start, HOST_DAYS)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(sign_certs=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName([_alt_name(host)]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        cert_file, key_file = host_files(host)
        written[cert_file] = _write(out / cert_file, cert.public_bytes(serialization.Encoding.PEM), secret=False)
        written[key_file] = _write(out / key_file, _pem_key(key), secret=True)
    return written


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, start: datetime.datetime, days: int
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - datetime.timedelta(minutes=5))  # a host whose clock runs a little slow
        .not_valid_after(start + datetime.timedelta(days=days))
    )


def _usage(*, sign_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certs,
        crl_sign=sign_certs,
        encipher_only=False,
        decipher_only=False,
    )


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, *, secret: bool) -> Path:
    if secret:
        write_secret(path, data)
    else:
        path.write_bytes(data)
    return path
