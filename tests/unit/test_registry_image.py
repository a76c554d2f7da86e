"""trainer_image's registry client (roles/trainer_image/library/ddpfleet_registry_image.py):
names, Docker's login, the manifest it writes, each layer's tar put together from a Docker
overlay2 store as Docker made it (and refused where the store's files changed), only what the
registry lacks sent (several layers at once, the largest first), what the host's Docker is told
of the pushed layers, the moving tag, and Docker's own push for other stores. The real registry
and Docker's pull of what it sends are e2e (test_20's site.yml, the testinfra suite)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from plugin_loader import load_plugin
from time_bounds import within

client = load_plugin(
    "ddpfleet_registry_image", "roles/trainer_image/library/ddpfleet_registry_image.py"
)


def digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("10.0.0.1:5000/ddpfleet/trainer", ("10.0.0.1:5000", "ddpfleet/trainer")),
        ("registry.example/team/x", ("registry.example", "team/x")),
        ("localhost/x", ("localhost", "x")),
    ],
)
def test_the_registry_is_the_names_first_part(name: str, expected: tuple[str, str]) -> None:
    assert client.split_name(name) == expected


@pytest.mark.parametrize("name", ["ddpfleet/trainer", "trainer", "10.0.0.1:5000"])
def test_a_name_without_a_registry_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="does not start with a registry host"):
        client.split_name(name)


def test_the_login_is_the_one_docker_login_wrote(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    auth = base64.b64encode(b"ddpfleet:s3cret").decode()
    config.write_text(json.dumps({"auths": {"node1:5000": {"auth": auth}}}))
    assert client.login(str(config), "node1:5000") == f"Basic {auth}"
    assert client.login(str(config), "node2:5000") is None
    assert client.login(str(tmp_path / "absent.json"), "node1:5000") is None


def test_the_manifest_names_uncompressed_layers_by_their_diff_ids() -> None:
    config = b'{"rootfs": {"diff_ids": ["sha256:aa", "sha256:bb"]}}'
    body = json.loads(client.manifest(config, [("sha256:aa", 10), ("sha256:bb", 20)]))
    assert body["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert body["config"] == {
        "mediaType": "application/vnd.docker.container.image.v1+json",
        "size": len(config),
        "digest": digest(config),
    }
    assert [(layer["mediaType"], layer["digest"], layer["size"]) for layer in body["layers"]] == [
        ("application/vnd.docker.image.rootfs.diff.tar", "sha256:aa", 10),
        ("application/vnd.docker.image.rootfs.diff.tar", "sha256:bb", 20),
    ]


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("https://node1:5000/v2/x/blobs/uploads/u?_state=s", "/v2/x/blobs/uploads/u?_state=s"),
        ("/v2/x/blobs/uploads/u", "/v2/x/blobs/uploads/u"),
    ],
)
def test_upload_locations_are_followed_as_paths(location: str, expected: str) -> None:
    assert client.relative(location) == expected


class Registry:
    """What the client asks of a registry, recorded: the blobs and tags it holds, and what
    was sent."""

    def __init__(self, held: dict[str, bytes], tags: dict[str, tuple[bytes, str]] | None = None):
        self.held, self.tags, self.sent = dict(held), dict(tags or {}), []

    def another(self) -> Registry:
        """Another connection to the same registry: what it sends is recorded here too."""
        return self

    def blob_size(self, d: str) -> int | None:
        return len(self.held[d]) if d in self.held else None

    def put_blob(self, stream, size: int) -> str:
        data = stream.read(size)
        self.held[digest(data)] = data
        self.sent.append(digest(data))
        return digest(data)

    def get_manifest(self, tag: str) -> tuple[bytes, str] | None:
        return self.tags.get(tag)

    def put_manifest(self, tag: str, body: bytes, media_type: str) -> None:
        self.tags[tag] = (body, media_type)
        self.sent.append(tag)


def test_chain_ids_are_the_names_dockers_layer_store_uses() -> None:
    """Three layers of a real image and the layerdb directories Docker 20.10 made for them."""
    diff_ids = [
        "sha256:26e5123cd2e3e9142c3f449a1003a162bc6f8c574ae019771b7091992c11ae86",
        "sha256:bb594ddc667409c3b14e46ce5d17b29b2ed3ada998491ab22d7236c737f30925",
        "sha256:1a3c48488433ae907cb1393e4669b328f49089b4a5d257705869e51038293b81",
    ]
    assert client.chain_ids(diff_ids) == [
        diff_ids[0],
        "sha256:78725c60da0e2196cd7c756840c070a6be661870509300ac47792b025bc80ec3",
        "sha256:189a880753be9aa5c379bbd12dc9099ab62169fb0056210a16927db8e66ffefd",
    ]


def split_layer(tmp_path: Path, files: dict[str, bytes]) -> tuple[bytes, Path, Path]:
    """A layer's tar, and what Docker's overlay2 store keeps of it: the tar-split record (the
    tar's bytes other than file contents, as segments, and each file's name and size) and the
    directory holding the files."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    tar = out.getvalue()
    diff, entries, at = tmp_path / "diff", [], 0
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for member in archive.getmembers():
            entries.append(
                {"type": 2, "payload": base64.b64encode(tar[at : member.offset_data]).decode()}
            )
            entries.append({"type": 1, "name": member.name, "size": member.size})
            (diff / member.name).parent.mkdir(parents=True, exist_ok=True)
            (diff / member.name).write_bytes(files[member.name])
            at = member.offset_data + member.size  # the padding opens the next segment
    entries.append({"type": 2, "payload": base64.b64encode(tar[at:]).decode()})
    record = tmp_path / "tar-split.json.gz"
    with gzip.open(record, "wt") as f:
        f.writelines(json.dumps(entry) + "\n" for entry in entries)
    return tar, record, diff


def test_a_layer_is_put_together_byte_for_byte_from_the_store(tmp_path: Path) -> None:
    files = {"opt/venv/big.so": bytes(range(256)) * 9000, "etc/x": b"x" * 700, "empty": b""}
    tar, record, diff = split_layer(tmp_path, files)
    layer = client.LayerTar(str(record), str(diff))
    assert layer.size == len(tar)
    got = b"".join(iter(lambda: layer.read(4096), b""))
    assert got == tar


def test_a_file_shorter_in_the_store_than_in_its_tar_is_named(tmp_path: Path) -> None:
    _, record, diff = split_layer(tmp_path, {"a": b"a" * 2000, "b": b"b" * 100})
    (diff / "a").write_bytes(b"a" * 1000)
    layer = client.LayerTar(str(record), str(diff))
    with pytest.raises(client.RegistryError, match="/a: shorter than its tar"):
        b"".join(iter(lambda: layer.read(1 << 20), b""))


def store(root: Path, layers: list[dict[str, bytes]]) -> tuple[str, list[str]]:
    """Docker's overlay2 store under root holding an image of these layers: its ID and diff
    IDs."""
    diff_ids, tars = [], []
    for i, files in enumerate(layers):
        tar, record, diff = split_layer(root / f"made{i}", files)
        diff_ids.append(digest(tar))
        tars.append((record, diff))
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    images = root / "image" / "overlay2"
    (images / "imagedb" / "content" / "sha256").mkdir(parents=True)
    (images / "imagedb" / "content" / "sha256" / digest(config)[7:]).write_bytes(config)
    for i, (chain, (record, diff)) in enumerate(zip(client.chain_ids(diff_ids), tars, strict=True)):
        layer = images / "layerdb" / "sha256" / chain[7:]
        layer.mkdir(parents=True)
        (layer / "cache-id").write_text(f"cache{i}")
        (layer / "size").write_text(str(sum(map(len, layers[i].values()))))  # as Docker does
        (layer / "tar-split.json.gz").write_bytes(record.read_bytes())
        (root / "overlay2" / f"cache{i}").mkdir(parents=True)
        diff.rename(root / "overlay2" / f"cache{i}" / "diff")
    return digest(config), diff_ids


def test_the_store_sends_only_the_layers_the_registry_lacks(tmp_path: Path) -> None:
    image_id, diff_ids = store(tmp_path, [{"base": b"b" * 3000}, {"torch.so": b"t" * 9000}])
    registry = Registry({diff_ids[0]: b"held"})
    sizes = {diff_ids[0]: 3584}
    config, sent = client.send_from_store(registry, str(tmp_path), image_id, diff_ids, sizes)
    assert digest(config) == image_id
    assert registry.sent == [diff_ids[1]]
    assert sent == sizes[diff_ids[1]] == len(registry.held[diff_ids[1]])


def test_the_largest_layers_go_first_and_a_wrong_one_ends_the_sending(tmp_path: Path) -> None:
    sizes = [3000, 9000, 1000, 5000]
    image_id, diff_ids = store(tmp_path, [{f"f{n}": b"x" * n} for n in sizes])
    registry = Registry({})
    client.send_from_store(registry, str(tmp_path), image_id, diff_ids, {}, uploads=1)
    assert registry.sent == [diff_ids[i] for i in (1, 3, 0, 2)]
    (tmp_path / "overlay2" / "cache3" / "diff" / "f5000").write_bytes(b"y" * 5000)
    registry = Registry({})
    with pytest.raises(client.RegistryError, match=f"layer {diff_ids[3]} put together"):
        client.send_from_store(registry, str(tmp_path), image_id, diff_ids, {}, uploads=1)
    # the largest sent, the wrong one sent and refused, the two smaller ones never read
    assert registry.sent[0] == diff_ids[1]
    assert len(registry.sent) == 2
    assert registry.sent[1] not in diff_ids


class Meeting(Registry):
    """A registry whose uploads each wait until ``parties`` of them are in flight at once."""

    def __init__(self, parties: int):
        super().__init__({})
        self.barrier = threading.Barrier(parties, timeout=within(10))  # a hang guard

    def put_blob(self, stream, size: int) -> str:
        self.barrier.wait()  # BrokenBarrierError: fewer were sent at once
        return super().put_blob(stream, size)


@pytest.mark.parametrize("uploads", [2, 3])
def test_up_to_uploads_layers_are_sent_at_once(tmp_path: Path, uploads: int) -> None:
    image_id, diff_ids = store(tmp_path, [{f"f{i}": bytes([i]) * 900} for i in range(uploads)])
    registry = Meeting(uploads)
    _, sent = client.send_from_store(
        registry, str(tmp_path), image_id, diff_ids, {}, uploads=uploads
    )
    assert sorted(registry.sent) == sorted(diff_ids)
    assert sent == sum(len(registry.held[d]) for d in diff_ids)


def test_a_store_whose_files_changed_is_refused_before_the_manifest(tmp_path: Path) -> None:
    image_id, diff_ids = store(tmp_path, [{"torch.so": b"t" * 9000}])
    (tmp_path / "overlay2" / "cache0" / "diff" / "torch.so").write_bytes(b"T" * 9000)
    with pytest.raises(client.RegistryError, match=f"layer {diff_ids[0]} put together"):
        client.send_from_store(Registry({}), str(tmp_path), image_id, diff_ids, {})


def test_a_new_image_is_sent_whole_and_named_by_one_manifest(tmp_path: Path) -> None:
    image_id, diff_ids = store(tmp_path, [{"base": b"b" * 3000}, {"torch.so": b"t" * 9000}])
    registry = Registry({})
    body, sent = client.push(registry, str(tmp_path), image_id, diff_ids)
    assert sorted(registry.sent[:2]) == sorted(diff_ids)
    assert registry.sent[2:] == [image_id]  # the config once its layers are there
    assert sent == sum(len(registry.held[d]) for d in [*diff_ids, image_id])
    layers = json.loads(body)["layers"]
    assert [(x["digest"], x["size"]) for x in layers] == [
        (d, len(registry.held[d])) for d in diff_ids
    ]


def test_the_moving_tag_is_the_source_tags_manifest_put_under_it() -> None:
    registry = Registry({}, {"abc": (b"{}", "application/vnd.oci.image.index.v1+json")})
    ref = "node1:5000/ddpfleet/trainer:latest"
    assert client.publish(registry, ref, "latest", "abc", check=True)[0] is True
    assert registry.sent == []
    # nothing sent, nothing recorded in the host's Docker
    assert client.publish(registry, ref, "latest", "abc", check=False) == (True, b"{}", 0, 0)
    assert registry.tags["latest"] == registry.tags["abc"]
    assert client.publish(registry, ref, "latest", "abc", check=False)[0] is False
    with pytest.raises(client.RegistryError, match="trainer:gone is not in the registry"):
        client.publish(registry, ref, "latest", "gone", check=False)


def test_another_image_store_is_pushed_by_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    registry, runs = Registry({}), []

    def run(argv, **kwargs):
        runs.append(argv)
        registry.tags["abc"] = (b'{"pushed": "by docker"}', client.MANIFEST)
        return SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(client, "local_image", lambda ref: ("sha256:c", ["sha256:l"], None))
    monkeypatch.setattr(client.subprocess, "run", run)
    changed, body, sent, recorded = client.publish(
        registry, "node1:5000/x:abc", "abc", None, check=False
    )
    assert runs == [["docker", "push", "node1:5000/x:abc"]]
    assert (changed, body, sent, registry.sent) == (True, b'{"pushed": "by docker"}', 0, [])
    assert recorded == 0  # Docker's push recorded its own


def test_check_mode_reports_an_image_not_built_yet_as_to_be_pushed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing(ref: str):
        raise client.RegistryError(f"{ref}: not on this host")

    monkeypatch.setattr(client, "local_image", missing)
    registry = Registry({})
    published = client.publish(registry, "node1:5000/x:abc", "abc", None, check=True)
    assert published == (True, None, 0, 0)
    with pytest.raises(client.RegistryError, match="not on this host"):
        client.publish(registry, "node1:5000/x:abc", "abc", None, check=False)
    assert registry.sent == []


def test_only_an_overlay2_store_with_its_layer_database_is_read(tmp_path: Path) -> None:
    """docker info's "<driver> <root>": the overlay2 store is read where its layerdb is there;
    another driver, an empty or one-field answer, or a root without a layerdb: docker push."""
    (tmp_path / "image" / "overlay2" / "layerdb").mkdir(parents=True)
    assert client.overlay2_root(f"overlay2 {tmp_path}\n") == str(tmp_path)
    assert client.overlay2_root(f"overlayfs {tmp_path}\n") is None  # the containerd store
    assert client.overlay2_root("overlay2 /nonexistent\n") is None
    assert client.overlay2_root("overlay2\n") is None
    assert client.overlay2_root("") is None


DISTRIBUTION = ("image", "overlay2", "distribution")


def docker_metadata(root: Path, diff_id: str) -> tuple[list[dict], str]:
    """What Docker's distribution metadata under root holds for a layer: its (digest,
    repository) entries, and the diff ID its digest equal to its diff ID maps to."""
    base = root.joinpath(*DISTRIBUTION)
    entries = json.loads((base / "v2metadata-by-diffid" / "sha256" / diff_id[7:]).read_text())
    return entries, (base / "diffid-by-digest" / "sha256" / diff_id[7:]).read_text()


def test_a_push_from_the_store_tells_docker_the_repository_holds_each_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Docker's own push records it (format of Docker 20.10's files), beside what Docker
    recorded itself (a gzipped copy pushed by docker push, with its HMAC): a later docker
    push of an image FROM this one mounts the layers, and names them by their diff IDs."""
    image_id, diff_ids = store(tmp_path, [{"base": b"b" * 3000}, {"torch.so": b"t" * 9000}])
    base = tmp_path.joinpath(*DISTRIBUTION)
    own = {"Digest": "sha256:" + "9" * 64, "SourceRepository": "node1:5000/me/x", "HMAC": "ab12"}
    (base / "v2metadata-by-diffid" / "sha256").mkdir(parents=True)
    (base / "v2metadata-by-diffid" / "sha256" / diff_ids[0][7:]).write_text(json.dumps([own]))
    monkeypatch.setattr(client, "local_image", lambda ref: (image_id, diff_ids, str(tmp_path)))
    registry = Registry({})
    ref = "node1:5000/ddpfleet/trainer:abc"
    assert client.publish(registry, ref, "abc", None, check=False)[3] == 2
    ours = {"Digest": "", "SourceRepository": "node1:5000/ddpfleet/trainer", "HMAC": ""}
    first, second = (docker_metadata(tmp_path, d) for d in diff_ids)
    assert first == ([own, {**ours, "Digest": diff_ids[0]}], diff_ids[0])
    assert second == ([{**ours, "Digest": diff_ids[1]}], diff_ids[1])
    modes = {p.stat().st_mode & 0o777 for p in base.rglob("*") if p.is_file()}
    assert modes == {0o644}
    assert [p.name for p in base.rglob("*.ddpfleet-*")] == []  # no temporary file left
    # pushed again (nothing to send): nothing new to record, the files as they were
    before = {p: p.read_bytes() for p in base.rglob("*") if p.is_file()}
    assert client.publish(registry, ref, "abc", None, check=False)[2:] == (0, 0)
    assert {p: p.read_bytes() for p in base.rglob("*") if p.is_file()} == before


def test_docker_keeps_fifty_entries_a_layer_and_a_store_never_pushed_from_is_left_alone(
    tmp_path: Path,
) -> None:
    diff_id = "sha256:" + "a" * 64
    assert client.record_in_docker(str(tmp_path), "node1:5000/t", [diff_id]) == 0
    assert not tmp_path.joinpath(*DISTRIBUTION).exists()  # Docker makes it on its first push
    held = tmp_path.joinpath(*DISTRIBUTION, "v2metadata-by-diffid", "sha256")
    held.mkdir(parents=True)
    old = [{"Digest": f"sha256:{i:064x}", "SourceRepository": "r/x", "HMAC": ""} for i in range(50)]
    (held / diff_id[7:]).write_text(json.dumps(old))
    assert client.record_in_docker(str(tmp_path), "node1:5000/t", [diff_id, diff_id]) == 1
    entries, mapped = docker_metadata(tmp_path, diff_id)
    assert entries[:-1] == old[1:]  # the oldest dropped, as Docker does
    assert (entries[-1]["SourceRepository"], mapped) == ("node1:5000/t", diff_id)
