"""roles/registry/action_plugins/ddpfleet_secrets_check.py's check, on real keys, CSRs,
certificates and an htpasswd file made here with cryptography and passlib as secrets.yml's
modules make them: all right reads as nothing to do, and each thing off is named.

Keys are made once per module, smaller than the role's (the sizes are the check's inputs)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from passlib.hash import bcrypt, md5_crypt
from plugin_loader import load_plugin

plugin = load_plugin(
    "ddpfleet_secrets_check", "roles/registry/action_plugins/ddpfleet_secrets_check.py"
)

NOW = dt.datetime.now(dt.timezone.utc)
RENEW_DAYS = 30
USER, PASSWORD = "ddpfleet", "s3cret-Passw0rd"
CA_BITS, KEY_BITS = 2048, 1024
CA_REQUEST = {
    "key_size": CA_BITS,
    "common_name": "test CA",
    "basic_constraints": ["CA:TRUE", "pathlen:0"],
    "basic_constraints_critical": True,
    "key_usage": ["keyCertSign", "cRLSign"],
    "key_usage_critical": True,
}
SANS = ["IP:10.0.0.5", "DNS:reg1", "DNS:reg1.cluster.internal"]
SERVER_REQUEST = {
    "key_size": KEY_BITS,
    "common_name": "reg1",
    "subject_alt_name": SANS,
    "extended_key_usage": ["serverAuth"],
    "key_usage": ["digitalSignature", "keyEncipherment"],
}
FILES = (
    "ca.key",
    "ca.csr",
    "ca.crt",
    "registry.key",
    "registry.csr",
    "registry.crt",
    "registry.htpasswd",
)
MODES = {".": 0o700, "ca.key": 0o600, "registry.key": 0o600, "registry.htpasswd": 0o600}
# (the CSRs and certificates: 0644)


@dataclass(frozen=True)
class Keys:
    ca: rsa.RSAPrivateKey
    server: rsa.RSAPrivateKey
    other: rsa.RSAPrivateKey  # a second key of the server's size


def _pem_key(key: rsa.RSAPrivateKey, password: bytes | None = None) -> bytes:
    crypt = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, crypt
    )


def _pem(obj: x509.Certificate | x509.CertificateSigningRequest) -> bytes:
    return obj.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca_extensions(key_usage_critical: bool = True) -> list[tuple[x509.ExtensionType, bool]]:
    usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
    return [(usage, key_usage_critical), (x509.BasicConstraints(ca=True, path_length=0), True)]


def _server_extensions(sans: list[str]) -> list[tuple[x509.ExtensionType, bool]]:
    names = [
        x509.IPAddress(ipaddress.ip_address(v[3:])) if v.startswith("IP:") else x509.DNSName(v[4:])
        for v in sans
    ]
    usage = x509.KeyUsage(True, False, True, False, False, False, False, False, False)
    return [
        (x509.SubjectAlternativeName(names), False),
        (usage, False),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
    ]


def make_csr(key: rsa.RSAPrivateKey, common_name: str, extensions: list) -> bytes:
    builder = x509.CertificateSigningRequestBuilder().subject_name(_name(common_name))
    for value, critical in extensions:
        builder = builder.add_extension(value, critical)
    return _pem(builder.sign(key, hashes.SHA256()))


def make_cert(
    public: rsa.RSAPublicKey,
    common_name: str,
    extensions: list,
    signer: rsa.RSAPrivateKey,
    *,
    issuer: x509.Certificate | None = None,
    days: int = 825,
) -> bytes:
    """Signed by ``signer``: self-signed (``issuer`` None) or by the CA ``issuer``, with the
    subject and authority key identifiers community.crypto's x509_certificate adds."""
    issued_by = issuer.subject if issuer else _name(common_name)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issued_by)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(NOW + dt.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), False)
    )
    for value, critical in extensions:
        builder = builder.add_extension(value, critical)
    if issuer is not None:
        ski = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
        builder = builder.add_extension(aki, False)
    return _pem(builder.sign(signer, hashes.SHA256()))


def server_cert(
    where: Path,
    keys: Keys,
    *,
    public: rsa.RSAPublicKey | None = None,
    sans: list[str] = SANS,
    days: int = 825,
) -> bytes:
    """registry.crt as the ownca task makes it, signed by ``where``'s CA (ca.crt, keys.ca)."""
    ca = x509.load_pem_x509_certificate((where / "ca.crt").read_bytes())
    public = public or keys.server.public_key()
    return make_cert(public, "reg1", _server_extensions(sans), keys.ca, issuer=ca, days=days)


def make_htpasswd(*lines: str) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()


def _bcrypt(password: str) -> str:
    return bcrypt.using(rounds=4).hash(password)


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(
        ca=rsa.generate_private_key(65537, CA_BITS),
        server=rsa.generate_private_key(65537, KEY_BITS),
        other=rsa.generate_private_key(65537, KEY_BITS),
    )


@pytest.fixture(scope="module")
def good(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A secrets directory as secrets.yml leaves it."""
    where = tmp_path_factory.mktemp("good") / "secrets"
    where.mkdir(mode=0o700)
    files = {
        "ca.key": _pem_key(keys.ca),
        "ca.csr": make_csr(keys.ca, "test CA", _ca_extensions()),
        "ca.crt": make_cert(keys.ca.public_key(), "test CA", _ca_extensions(), keys.ca),
        "registry.key": _pem_key(keys.server),
        "registry.csr": make_csr(keys.server, "reg1", _server_extensions(SANS)),
        "registry.htpasswd": make_htpasswd(f"{USER}:{_bcrypt(PASSWORD)}"),
    }
    for name, data in files.items():
        (where / name).write_bytes(data)
    (where / "registry.crt").write_bytes(server_cert(where, keys))
    for name in FILES:
        (where / name).chmod(MODES.get(name, 0o644))
    return where


@pytest.fixture
def secrets(good: Path, tmp_path: Path) -> Path:
    """A copy of the good directory, for one test to spoil."""
    where = tmp_path / "secrets"
    shutil.copytree(good, where)
    where.chmod(0o700)
    return where


def check(where: Path, **change: object) -> list[str]:
    paths = plugin.Paths(str(where), *(str(where / name) for name in FILES))
    args: dict = {
        "ca": CA_REQUEST,
        "server": SERVER_REQUEST,
        "renew_days": RENEW_DAYS,
        "username": USER,
        "password": PASSWORD,
        "now": NOW,
        **change,
    }
    return plugin.check(paths, args.pop("ca"), args.pop("server"), **args)


def write(where: Path, name: str, data: bytes) -> None:
    (where / name).write_bytes(data)  # keeps the file's mode


def test_secrets_as_the_tasks_leave_them_are_ok(good: Path) -> None:
    assert check(good) == []


def test_a_missing_directory_is_the_one_reason(tmp_path: Path) -> None:
    assert check(tmp_path / "secrets") == ["secrets: missing"]


@pytest.mark.parametrize("name", FILES)
def test_a_missing_file_is_named(secrets: Path, name: str) -> None:
    (secrets / name).unlink()
    assert f"{name}: missing" in check(secrets)


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        (".", 0o755),
        ("ca.key", 0o644),
        ("registry.key", 0o640),
        ("ca.csr", 0o600),
        ("ca.crt", 0o600),
        ("registry.crt", 0o664),
        ("registry.htpasswd", 0o644),
    ],
)
def test_a_wrong_mode_is_named(secrets: Path, name: str, mode: int) -> None:
    (secrets / name).chmod(mode)
    label = "secrets" if name == "." else name
    wanted = MODES.get(name, 0o644)
    assert check(secrets) == [f"{label}: mode {mode:04o}, not {wanted:04o}"]


def test_a_directory_in_place_of_a_file_is_named(secrets: Path) -> None:
    (secrets / "registry.htpasswd").unlink()
    (secrets / "registry.htpasswd").mkdir()
    assert "registry.htpasswd: not a file" in check(secrets)


@pytest.mark.parametrize(
    ("request_name", "file", "wanted", "has"),
    [("ca", "ca.key", 4096, CA_BITS), ("server", "registry.key", 2048, KEY_BITS)],
)
def test_a_wrong_key_size_is_named(
    good: Path, request_name: str, file: str, wanted: int, has: int
) -> None:
    request = {**(CA_REQUEST if request_name == "ca" else SERVER_REQUEST), "key_size": wanted}
    assert f"{file}: {has} bits, not {wanted}" in check(good, **{request_name: request})


def test_an_encrypted_key_is_named(secrets: Path, keys: Keys) -> None:
    write(secrets, "registry.key", _pem_key(keys.server, b"passphrase"))
    assert "registry.key: encrypted" in check(secrets)


def test_a_file_that_is_no_key_is_named(secrets: Path) -> None:
    write(secrets, "ca.key", b"not a key\n")
    assert "ca.key: not a PEM private key" in check(secrets)


def test_a_csr_for_another_key_is_named(secrets: Path, keys: Keys) -> None:
    write(secrets, "registry.csr", make_csr(keys.other, "reg1", _server_extensions(SANS)))
    assert check(secrets) == ["registry.csr: not for its key"]


def test_a_certificate_for_another_key_is_named(secrets: Path, keys: Keys) -> None:
    write(secrets, "registry.crt", server_cert(secrets, keys, public=keys.other.public_key()))
    assert check(secrets) == ["registry.crt: not for its key"]


def test_a_certificate_signed_by_another_ca_is_named(secrets: Path, keys: Keys) -> None:
    # Another CA of the same name: only the signature (and the key identifier) tells.
    other_ca = x509.load_pem_x509_certificate(
        make_cert(keys.other.public_key(), "test CA", _ca_extensions(), keys.other)
    )
    exts = _server_extensions(SANS)
    cert = make_cert(keys.server.public_key(), "reg1", exts, keys.other, issuer=other_ca)
    write(secrets, "registry.crt", cert)
    assert "registry.crt: not signed by the CA" in check(secrets)


def test_a_ca_certificate_not_signed_by_its_key_is_named(secrets: Path, keys: Keys) -> None:
    cert = make_cert(keys.ca.public_key(), "test CA", _ca_extensions(), keys.other)
    write(secrets, "ca.crt", cert)
    assert "ca.crt: not signed by its own key" in check(secrets)


@pytest.mark.parametrize(
    "sans",
    [SANS[1:], SANS[:2], [*SANS, "DNS:registry"], ["IP:10.0.0.6", *SANS[1:]]],
    ids=["no IP", "no FQDN", "an extra name", "another IP"],
)
def test_a_san_missing_or_extra_is_named(secrets: Path, keys: Keys, sans: list[str]) -> None:
    write(secrets, "registry.csr", make_csr(keys.server, "reg1", _server_extensions(sans)))
    write(secrets, "registry.crt", server_cert(secrets, keys, sans=sans))
    assert check(secrets) == [
        "registry.csr: subjectAltName differs",
        "registry.crt: subjectAltName differs",
    ]


def test_sans_in_another_order_are_the_same(secrets: Path, keys: Keys) -> None:
    write(secrets, "registry.csr", make_csr(keys.server, "reg1", _server_extensions(SANS[::-1])))
    write(secrets, "registry.crt", server_cert(secrets, keys, sans=SANS[::-1]))
    assert check(secrets) == []


def test_a_wrong_common_name_is_named(good: Path) -> None:
    assert check(good, ca={**CA_REQUEST, "common_name": "another CA"}) == [
        "ca.csr: subject is not CN=another CA",
        "ca.crt: subject is not CN=another CA",
    ]


def test_an_extension_with_another_criticality_is_named(secrets: Path, keys: Keys) -> None:
    exts = _ca_extensions(key_usage_critical=False)
    write(secrets, "ca.csr", make_csr(keys.ca, "test CA", exts))
    assert check(secrets) == ["ca.csr: keyUsage differs"]


def test_an_extension_not_asked_for_is_named(good: Path) -> None:
    server = {**SERVER_REQUEST, "extended_key_usage": []}
    assert "registry.crt: extendedKeyUsage not asked for" in check(good, server=server)


def test_an_extension_missing_is_named(good: Path) -> None:
    server = {**SERVER_REQUEST, "basic_constraints": ["CA:FALSE"]}
    assert "registry.csr: basicConstraints missing" in check(good, server=server)


@pytest.mark.parametrize("name", ["ca.crt", "registry.crt"])
def test_a_certificate_expiring_within_the_renew_days_is_named(
    secrets: Path, keys: Keys, name: str
) -> None:
    days = RENEW_DAYS - 1
    if name == "ca.crt":  # the same key and name: the registry's certificate still verifies
        cert = make_cert(keys.ca.public_key(), "test CA", _ca_extensions(), keys.ca, days=days)
    else:
        cert = server_cert(secrets, keys, days=days)
    write(secrets, name, cert)
    assert check(secrets) == [f"{name}: expires within {RENEW_DAYS} days"]


def test_a_certificate_with_more_than_the_renew_days_left_is_ok(good: Path) -> None:
    assert check(good, now=NOW + dt.timedelta(days=825 - RENEW_DAYS - 2)) == []


def test_an_expired_certificate_is_named(good: Path) -> None:
    assert "registry.crt: not valid now" in check(good, now=NOW + dt.timedelta(days=900))


def test_an_htpasswd_hash_that_does_not_verify_the_password_is_named(secrets: Path) -> None:
    write(secrets, "registry.htpasswd", make_htpasswd(f"{USER}:{_bcrypt('another')}"))
    wrong = f"registry.htpasswd: the hash for {USER} does not verify the password"
    assert check(secrets) == [wrong]


@pytest.mark.parametrize(
    "lines",
    [[], [f"someone:{_bcrypt(PASSWORD)}"], [f"{USER}:{_bcrypt(PASSWORD)}"] * 2],
    ids=["empty", "another user only", "the user twice"],
)
def test_an_htpasswd_without_exactly_one_line_for_the_user_is_named(
    secrets: Path, lines: list[str]
) -> None:
    write(secrets, "registry.htpasswd", make_htpasswd(*lines))
    count = sum(line.startswith(f"{USER}:") for line in lines)
    assert check(secrets) == [f"registry.htpasswd: {count} lines for {USER}, not 1"]


def test_an_htpasswd_hash_that_is_not_bcrypt_is_named(secrets: Path) -> None:
    write(secrets, "registry.htpasswd", make_htpasswd(f"{USER}:{md5_crypt.hash(PASSWORD)}"))
    assert check(secrets) == [f"registry.htpasswd: the hash for {USER} is not bcrypt"]


def test_the_reasons_hold_no_password_hash_or_key(secrets: Path) -> None:
    hashed = (secrets / "registry.htpasswd").read_text().split(":", 1)[1].strip()
    (secrets / "registry.key").chmod(0o644)
    reasons = check(secrets, password="the-wrong-one")
    assert "registry.key: mode 0644, not 0600" in reasons
    text = "\n".join(reasons)
    for secret in ("the-wrong-one", PASSWORD, hashed, "PRIVATE KEY", "$2b$"):
        assert secret not in text


def test_a_name_the_check_does_not_know_is_an_error(good: Path) -> None:
    with pytest.raises(ValueError, match="extended key usage not known here: anyUsage"):
        check(good, server={**SERVER_REQUEST, "extended_key_usage": ["anyUsage"]})
