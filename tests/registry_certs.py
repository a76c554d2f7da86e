"""The registry's certificate made to expire soon, as the unit and e2e tiers' renewal tests
need it: the role must re-issue a certificate close to expiry and keep one with time left."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization


def sign_short_lived(secrets: Path, days: int) -> None:
    """Replace ``secrets``/registry.crt by one for the same key, names and extensions, signed
    by the cluster CA beside it (ca.crt, ca.key), that expires in ``days``."""
    ca_cert = x509.load_pem_x509_certificate((secrets / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((secrets / "ca.key").read_bytes(), None)
    old = x509.load_pem_x509_certificate((secrets / "registry.crt").read_bytes())
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(old.subject)
        .issuer_name(ca_cert.subject)
        .public_key(old.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=days))
    )
    for ext in old.extensions:
        builder = builder.add_extension(ext.value, ext.critical)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    (secrets / "registry.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
