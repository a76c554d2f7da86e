"""ddpfleet_secrets_check: are the registry's controller-side secrets all there and right?

secrets.yml makes the cluster CA (key, CSR, self-signed certificate), the registry's key, CSR
and certificate signed by that CA, and the bcrypt htpasswd entry: a module process per file,
on every run. This plugin answers in the controller's worker process (no module run) whether
those tasks would change anything; where it says ``ok``, secrets.yml skips them.

It checks every property the tasks would otherwise fix, at least as strictly as
community.crypto's and community.general's modules judge it: the directory (0700); each key
(0600, an unencrypted RSA key of the requested size); each CSR (0644, signed by its key, the
requested subject and extensions); each certificate (0644, for its key, the CSR's subject and
extensions, the subject and authority key identifiers, signed by the CA, valid now and still
``renew_days`` from now: the tasks' renew rule); the htpasswd file (0600, exactly one line for
``username``, a bcrypt hash that verifies ``password``).

Returns ``ok`` and ``reasons`` (what is off, one short line each, naming the file); never key
material, the password or its hash. It only reads, so check mode runs it as it is, and it never
reports a change. Where it cannot judge (a library missing, a name in a request it does not
know), that is the reason and ``ok`` is false: the tasks then run as they always did.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ansible.plugins.action import ActionBase

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    from passlib.hash import bcrypt

    MISSING = ""
except ImportError as exc:  # the tasks it stands in for need these too
    MISSING = f"cannot check on the controller: {exc}"

REQUEST = {  # what one openssl_csr task asks for (its parameter names)
    "key_size": {"type": "int", "required": True},
    "common_name": {"type": "str", "required": True},
    "subject_alt_name": {"type": "list", "elements": "str", "default": []},
    "basic_constraints": {"type": "list", "elements": "str", "default": []},
    "basic_constraints_critical": {"type": "bool", "default": False},
    "key_usage": {"type": "list", "elements": "str", "default": []},
    "key_usage_critical": {"type": "bool", "default": False},
    "extended_key_usage": {"type": "list", "elements": "str", "default": []},
    "extended_key_usage_critical": {"type": "bool", "default": False},
}
PATHS = ("dir", "ca_key", "ca_csr", "ca_cert", "key", "csr", "cert", "htpasswd")
SPEC = {
    **{name: {"type": "path", "required": True} for name in PATHS},
    "ca": {"type": "dict", "required": True, "options": REQUEST},
    "server": {"type": "dict", "required": True, "options": REQUEST},
    "renew_days": {"type": "int", "required": True},
    "username": {"type": "str", "required": True},
    "password": {"type": "str", "required": True, "no_log": True},
}
KEY_USAGE = {  # openssl_csr's names: cryptography's KeyUsage fields
    "digitalSignature": "digital_signature",
    "nonRepudiation": "content_commitment",
    "keyEncipherment": "key_encipherment",
    "dataEncipherment": "data_encipherment",
    "keyAgreement": "key_agreement",
    "keyCertSign": "key_cert_sign",
    "cRLSign": "crl_sign",
    "encipherOnly": "encipher_only",
    "decipherOnly": "decipher_only",
}
EXTENDED_KEY_USAGE = {  # openssl_csr's names: cryptography's OIDs
    "serverAuth": "SERVER_AUTH",
    "clientAuth": "CLIENT_AUTH",
    "codeSigning": "CODE_SIGNING",
    "emailProtection": "EMAIL_PROTECTION",
    "timeStamping": "TIME_STAMPING",
    "OCSPSigning": "OCSP_SIGNING",
}
MAX_BYTES = 1 << 20  # none of these files is near this; a bigger one is not ours


@dataclass(frozen=True)
class Paths:
    dir: str
    ca_key: str
    ca_csr: str
    ca_cert: str
    key: str
    csr: str
    cert: str
    htpasswd: str


def expected_extensions(req: dict) -> dict:
    """The extensions a CSR made from ``req`` carries, by OID (ValueError: a name not known)."""
    exts: list = []
    if req.get("subject_alt_name"):
        names = [_general_name(name) for name in req["subject_alt_name"]]
        exts.append((x509.SubjectAlternativeName(names), False))
    if req.get("key_usage"):
        _known(req["key_usage"], KEY_USAGE, "key usage")
        fields = {field: name in req["key_usage"] for name, field in KEY_USAGE.items()}
        exts.append((x509.KeyUsage(**fields), req.get("key_usage_critical", False)))
    if req.get("extended_key_usage"):
        _known(req["extended_key_usage"], EXTENDED_KEY_USAGE, "extended key usage")
        oids = [
            getattr(ExtendedKeyUsageOID, EXTENDED_KEY_USAGE[n]) for n in req["extended_key_usage"]
        ]
        critical = req.get("extended_key_usage_critical", False)
        exts.append((x509.ExtendedKeyUsage(oids), critical))
    if req.get("basic_constraints"):
        flags = dict(item.split(":", 1) for item in req["basic_constraints"])
        is_ca = flags.get("CA", "").upper() == "TRUE"
        path_length = int(flags["pathlen"]) if "pathlen" in flags else None
        constraints = x509.BasicConstraints(ca=is_ca, path_length=path_length)
        exts.append((constraints, req.get("basic_constraints_critical", False)))
    return {value.oid: x509.Extension(value.oid, critical, value) for value, critical in exts}


def _general_name(name: str) -> x509.GeneralName:
    kind, _, value = name.partition(":")
    if kind == "IP":
        return x509.IPAddress(ipaddress.ip_address(value))
    if kind == "DNS":
        return x509.DNSName(value)
    raise ValueError(f"subject alt name not known here: {kind}")


def _known(names: list[str], table: dict, what: str) -> None:
    unknown = sorted(set(names) - set(table))
    if unknown:
        raise ValueError(f"{what} not known here: {', '.join(unknown)}")


def _same(ext: x509.Extension, want: x509.Extension) -> bool:
    """Equal as the modules judge it: names and usages as sets, the rest as values."""
    if ext.critical != want.critical:
        return False
    if isinstance(want.value, (x509.SubjectAlternativeName, x509.ExtendedKeyUsage)):
        return set(ext.value) == set(want.value)
    return ext.value == want.value


def _spki(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def read(path: str, mode: int, reasons: list[str], directory: bool = False) -> bytes | None:
    """The file's bytes (b"" for a directory) where it is there; else None and a reason.
    A mode other than ``mode`` is a reason too (the bytes are still returned)."""
    name = Path(path).name
    try:
        st = os.stat(path)
        if not (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
            reasons.append(f"{name}: not a {'directory' if directory else 'file'}")
            return None
        if stat.S_IMODE(st.st_mode) != mode:
            reasons.append(f"{name}: mode {stat.S_IMODE(st.st_mode):04o}, not {mode:04o}")
        if st.st_size > MAX_BYTES and not directory:
            reasons.append(f"{name}: {st.st_size} bytes, too large")
            return None
        return b"" if directory else Path(path).read_bytes()
    except FileNotFoundError:
        reasons.append(f"{name}: missing")
    except OSError as exc:
        reasons.append(f"{name}: cannot be read ({exc.strerror})")
    return None


def check_key(path: str, size: int, reasons: list[str]) -> rsa.RSAPrivateKey | None:
    """The key where it is an unencrypted RSA key of ``size`` bits, 0600."""
    name, data = Path(path).name, read(path, 0o600, reasons)
    if data is None:
        return None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        reasons.append(f"{name}: encrypted")
        return None
    except ValueError:
        reasons.append(f"{name}: not a PEM private key")
        return None
    if not isinstance(key, rsa.RSAPrivateKey):
        reasons.append(f"{name}: not an RSA key")
        return None
    if key.key_size != size:
        reasons.append(f"{name}: {key.key_size} bits, not {size}")
        return None
    return key


def _subject_and_extensions(name: str, obj: object, req: dict, skip: tuple = ()) -> list[str]:
    """What differs between a CSR's or certificate's subject and extensions and ``req``."""
    out = []
    subject = [(a.oid, a.value) for a in obj.subject]  # type: ignore[attr-defined]
    if subject != [(NameOID.COMMON_NAME, req["common_name"])]:
        out.append(f"{name}: subject is not CN={req['common_name']}")
    want = expected_extensions(req)
    have = {e.oid: e for e in obj.extensions if not isinstance(e.value, skip)}  # type: ignore[attr-defined]
    for oid in sorted(set(want) | set(have), key=lambda o: o.dotted_string):
        label = getattr(oid, "_name", oid.dotted_string)
        if oid not in have:
            out.append(f"{name}: {label} missing")
        elif oid not in want:
            out.append(f"{name}: {label} not asked for")
        elif not _same(have[oid], want[oid]):
            out.append(f"{name}: {label} differs")
    return out


def check_csr(path: str, key: rsa.RSAPrivateKey | None, req: dict, reasons: list[str]) -> None:
    """The CSR is 0644, signed by ``key`` and asks for ``req``."""
    name, data = Path(path).name, read(path, 0o644, reasons)
    if data is None:
        return
    try:
        csr = x509.load_pem_x509_csr(data)
    except ValueError:
        reasons.append(f"{name}: not a PEM CSR")
        return
    if not csr.is_signature_valid:
        reasons.append(f"{name}: its signature does not verify")
    if key is not None and _spki(csr.public_key()) != _spki(key.public_key()):
        reasons.append(f"{name}: not for its key")
    reasons += _subject_and_extensions(name, csr, req)


def check_cert(
    path: str,
    key: rsa.RSAPrivateKey | None,
    req: dict,
    reasons: list[str],
    *,
    issuer: x509.Certificate | None,
    renew_days: int,
    now: dt.datetime,
) -> x509.Certificate | None:
    """The certificate is 0644, for ``key``, as ``req`` asks, signed by ``issuer`` (None: by
    itself, for ``key``) and valid from now to ``renew_days`` from now; returned where it
    parses."""
    name, data = Path(path).name, read(path, 0o644, reasons)
    if data is None:
        return None
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError:
        reasons.append(f"{name}: not a PEM certificate")
        return None
    if key is not None and _spki(cert.public_key()) != _spki(key.public_key()):
        reasons.append(f"{name}: not for its key")
    skip = (x509.SubjectKeyIdentifier,) + (() if issuer is None else (x509.AuthorityKeyIdentifier,))
    reasons += _subject_and_extensions(name, cert, req, skip)
    own_ski = x509.SubjectKeyIdentifier.from_public_key(cert.public_key())  # type: ignore[arg-type]
    try:
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
        if ski.critical or ski.value != own_ski:
            reasons.append(f"{name}: subjectKeyIdentifier differs")
    except x509.ExtensionNotFound:
        reasons.append(f"{name}: subjectKeyIdentifier missing")
    try:  # the issuer's name and its signature (self-signed: the certificate's own key)
        cert.verify_directly_issued_by(cert if issuer is None else issuer)
    except (ValueError, TypeError, InvalidSignature):
        reasons.append(f"{name}: not signed by {'its own key' if issuer is None else 'the CA'}")
    if issuer is not None:
        try:
            aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
            ca_ski = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            if aki != x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski):
                reasons.append(f"{name}: authorityKeyIdentifier is not the CA's")
        except x509.ExtensionNotFound:
            reasons.append(f"{name}: authorityKeyIdentifier missing")
    renew = now + dt.timedelta(days=renew_days)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        reasons.append(f"{name}: not valid now")
    elif cert.not_valid_after_utc < renew:
        reasons.append(f"{name}: expires within {renew_days} days")
    return cert


def check_htpasswd(path: str, username: str, password: str, reasons: list[str]) -> None:
    """One line for ``username``, a bcrypt hash that verifies ``password``; 0600."""
    name, data = Path(path).name, read(path, 0o600, reasons)
    if data is None:
        return
    lines = [line.split(":", 1) for line in data.decode("utf-8", "replace").splitlines()]
    hashes = [rest[0] for user, *rest in lines if user == username and rest]
    if len(hashes) != 1:
        reasons.append(f"{name}: {len(hashes)} lines for {username}, not 1")
        return
    if not hashes[0].startswith(("$2a$", "$2b$", "$2y$")):
        reasons.append(f"{name}: the hash for {username} is not bcrypt")
        return
    try:
        verified = bcrypt.verify(password, hashes[0])
    except ValueError:
        verified = False
    if not verified:
        reasons.append(f"{name}: the hash for {username} does not verify the password")


def check(
    paths: Paths,
    ca: dict,
    server: dict,
    *,
    renew_days: int,
    username: str,
    password: str,
    now: dt.datetime | None = None,
) -> list[str]:
    """What is off in the secrets the tasks make (empty: nothing; the tasks would change
    nothing). ``ca`` and ``server`` are the openssl_csr tasks' requests, with ``key_size``."""
    if MISSING:
        return [MISSING]
    now = now or dt.datetime.now(dt.timezone.utc)
    reasons: list[str] = []
    if read(paths.dir, 0o700, reasons, directory=True) is None:
        return reasons  # nothing in it to look at
    ca_key = check_key(paths.ca_key, ca["key_size"], reasons)
    key = check_key(paths.key, server["key_size"], reasons)
    check_csr(paths.ca_csr, ca_key, ca, reasons)
    check_csr(paths.csr, key, server, reasons)
    when = {"renew_days": renew_days, "now": now}
    ca_cert = check_cert(paths.ca_cert, ca_key, ca, reasons, issuer=None, **when)
    if ca_cert is not None:  # else a new CA is made, and the registry's certificate with it
        check_cert(paths.cert, key, server, reasons, issuer=ca_cert, **when)
    check_htpasswd(paths.htpasswd, username, password, reasons)
    return reasons


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True  # it only reads

    def run(self, tmp: object = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _, a = self.validate_argument_spec(argument_spec=SPEC)
        paths = Paths(**{name: a[name] for name in PATHS})
        try:
            reasons = check(
                paths,
                a["ca"],
                a["server"],
                renew_days=a["renew_days"],
                username=a["username"],
                password=a["password"],
            )
        except ValueError as exc:  # a request this check cannot judge: the tasks then run
            reasons = [f"cannot check: {exc}"]
        return {**result, "changed": False, "ok": not reasons, "reasons": reasons}
