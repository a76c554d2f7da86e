#!/usr/bin/python
"""Put an image in the cluster registry with its layers uncompressed (registry API v2)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.client
import io
import json
import os
import ssl
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ddpfleet_registry_image
short_description: Push a local image to a registry with uncompressed layers, or tag it there
description:
- C(docker push) gzips every layer, and every C(docker pull) gunzips it again. On a cluster's
  own network that is the slow part; a 6 GB training image took 214 s to push and 240 s to
  pull onto two trainers on a 2-core host, nearly all of it (de)compression. This module sends
  each layer as the tar Docker keeps (media type
  C(application/vnd.docker.image.rootfs.diff.tar), which every Docker pulls), so its digest
  is its diff ID and a pull only checks and unpacks it.
- Each layer's tar is put together as Docker's own export does it, from the classic overlay2
  image store (the tar-split record of its headers and the layer's directory), and checked
  against its diff ID before the manifest names it. Where Docker keeps images otherwise (the
  containerd image store, another storage driver), the module runs C(docker push) instead.
- Layers the registry already holds are not read or sent again, nor is a config it holds.
- Up to I(uploads) layers are sent at once, the largest first, each over its own connection.
  One at a time, the registry (which checks each layer's digest as it comes) stayed near one
  core and the push took 1.5 times as long from a 2-core host.
- After a push from the overlay2 store, the host's Docker is told what its own push would have
  recorded, that each layer is in this repository under a blob digest that is its diff ID
  (Docker's distribution metadata, C(image/overlay2/distribution) under its root). A
  C(docker push) on this host of an image built C(FROM) this one then mounts those layers in
  the registry instead of gzipping and uploading them again, and its manifest names them by the
  digests every host that pulled this image already holds, so those hosts pull only the layers
  added on top.
- With I(source_tag), the manifest of that tag in the registry is put under I(tag), and the
  image need not be on this host.
- Logs in and trusts the registry as Docker does on this host, from the C(auths) entry of
  Docker's config file, the CA in C(/etc/docker/certs.d/<registry>/ca.crt) (else the system's).
- In check mode nothing is sent; what would change is reported.
options:
  name:
    description: The repository, with its registry (C(registry.example:5000/team/trainer)).
    type: str
    required: true
  tag:
    description: The tag to put in the registry.
    type: str
    required: true
  source_tag:
    description: A tag of I(name) in the registry whose manifest I(tag) should point at.
      Unset, the local image I(name):I(tag) is pushed.
    type: str
  docker_config:
    description: Docker's config file with the registry's login.
    type: path
    default: /root/.docker/config.json
  timeout:
    description: Seconds one request may wait for the registry.
    type: int
    default: 300
  uploads:
    description: How many layers are sent at once, each over its own connection.
    type: int
    default: 3
author: ddpfleet
"""

RETURN = r"""
digest:
  description: The digest of the manifest I(tag) points at.
  type: str
  returned: success
sent_bytes:
  description: Bytes of layers and config sent (0 when the registry held them all).
  type: int
  returned: success
recorded_layers:
  description: Layers newly recorded in this host's Docker as held by the repository.
  type: int
  returned: success
"""

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
# What a tag may point at: a tag is copied whatever of these it holds.
MANIFESTS = ", ".join([MANIFEST, MANIFEST_LIST, OCI_MANIFEST, OCI_INDEX])
CHUNK = 1 << 20
# Layers sent at once: a 4.1 GB image of 16 layers (the largest 1.2 GB) took 28-29 s one layer
# at a time and 18-19 s three at once, the largest first, from a 2-core host (2, 4: within 1 s
# of 3), the registry's digest checks no longer bound by one core (EPYC, 2026-12-07).
UPLOADS = 3


def split_name(name: str) -> tuple[str, str]:
    """(registry, repository) of a repository name that starts with its registry."""
    registry, _, repository = name.partition("/")
    if not repository or not ("." in registry or ":" in registry or registry == "localhost"):
        raise ValueError(f"{name}: the name does not start with a registry host")
    return registry, repository


def login(config_path: str, registry: str) -> str | None:
    """The Authorization header Docker would send to the registry, from its config file."""
    try:
        with open(config_path, encoding="utf-8") as f:
            auths = json.load(f).get("auths", {})
    except FileNotFoundError:
        return None
    entry = auths.get(registry) or auths.get(f"https://{registry}") or {}
    if entry.get("auth"):
        return f"Basic {entry['auth']}"
    if entry.get("username"):
        pair = f"{entry['username']}:{entry.get('password', '')}".encode()
        return f"Basic {base64.b64encode(pair).decode()}"
    return None


def manifest(config: bytes, layers: list[tuple[str, int]]) -> bytes:
    """A schema 2 manifest of the config's bytes and the (diff ID, size) of each layer."""
    body = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "size": len(config), "digest": sha256(config)},
        "layers": [{"mediaType": LAYER, "size": size, "digest": d} for d, size in layers],
    }
    return json.dumps(body, indent=3).encode()


def sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


class RegistryError(Exception):
    pass


class Registry:
    """One repository of a registry, over one kept-alive HTTPS connection."""

    def __init__(self, registry: str, repository: str, auth: str | None, timeout: int):
        self.args = (registry, repository, auth, timeout)
        ca = f"/etc/docker/certs.d/{registry}/ca.crt"
        context = ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)
        host, _, port = registry.partition(":")
        self.conn = http.client.HTTPSConnection(
            host, int(port or 443), context=context, timeout=timeout
        )
        self.base = f"/v2/{repository}"
        self.auth = {"Authorization": auth} if auth else {}

    def another(self) -> Registry:
        """The same repository over a connection of its own, for another thread."""
        return Registry(*self.args)

    def call(
        self, method: str, path: str, ok: tuple[int, ...], *, body=None, headers=None, size=None
    ) -> http.client.HTTPResponse:
        """Send one request (body: bytes, or a file read in chunks when size is given)."""
        headers = {**self.auth, **(headers or {})}
        if size is None:
            self.conn.request(method, path, body=body, headers=headers)
        else:
            self.conn.putrequest(method, path)
            for key, value in {**headers, "Content-Length": str(size)}.items():
                self.conn.putheader(key, value)
            self.conn.endheaders()
            for block in iter(lambda: body.read(CHUNK), b""):
                self.conn.send(block)
        response = self.conn.getresponse()
        data = response.read()
        if response.status not in ok:
            text = data.decode(errors="replace").strip()[:300]
            raise RegistryError(f"{method} {path.partition('?')[0]}: HTTP {response.status} {text}")
        response.body = data
        return response

    def blob_size(self, digest: str) -> int | None:
        response = self.call("HEAD", f"{self.base}/blobs/{digest}", ok=(200, 404))
        return int(response.headers["Content-Length"]) if response.status == 200 else None

    def put_blob(self, stream, size: int) -> str:
        """Upload size bytes of a stream as one blob; its digest, computed on the way."""
        location = self.call("POST", f"{self.base}/blobs/uploads/", ok=(202,)).headers["Location"]
        hashed = Hashing(stream)
        response = self.call(
            "PATCH",
            relative(location),
            ok=(202,),
            body=hashed,
            size=size,
            headers={"Content-Type": "application/octet-stream"},
        )
        digest = f"sha256:{hashed.digest.hexdigest()}"
        location = relative(response.headers["Location"])
        joined = "&" if "?" in location else "?"
        self.call("PUT", f"{location}{joined}digest={digest}", ok=(201,), body=b"")
        return digest

    def get_manifest(self, tag: str) -> tuple[bytes, str] | None:
        response = self.call(
            "GET",
            f"{self.base}/manifests/{tag}",
            ok=(200, 404),
            headers={"Accept": MANIFESTS},
        )
        if response.status == 404:
            return None
        return response.body, response.headers["Content-Type"]

    def put_manifest(self, tag: str, body: bytes, media_type: str) -> None:
        self.call(
            "PUT",
            f"{self.base}/manifests/{tag}",
            ok=(201,),
            body=body,
            headers={"Content-Type": media_type},
        )


class Hashing:
    """A reader that hashes what is read through it."""

    def __init__(self, stream):
        self.stream, self.digest = stream, hashlib.sha256()

    def read(self, size: int) -> bytes:
        block = self.stream.read(size)
        self.digest.update(block)
        return block


def relative(location: str) -> str:
    """The path and query of a Location header (the registry may send an absolute URL)."""
    parts = urlsplit(location)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


def local_image(ref: str) -> tuple[str, list[str], str | None]:
    """The local image's ID (its config's digest), its layers' diff IDs in order, and Docker's
    root directory where its image store is the classic overlay2 one (else None)."""
    run = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .}}", ref],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        raise RegistryError(f"{ref}: not on this host ({run.stderr.strip()})")
    image = json.loads(run.stdout)
    info = subprocess.run(
        ["docker", "info", "--format", "{{.Driver}} {{.DockerRootDir}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if info.returncode != 0:
        raise RegistryError(f"docker info failed: {info.stderr.strip()}")
    return image["Id"], image["RootFS"]["Layers"], overlay2_root(info.stdout)


def overlay2_root(info: str) -> str | None:
    """Docker's root directory, from ``docker info``'s "<driver> <root>", where its image
    store is the classic overlay2 one; None for any other store, or an answer without both."""
    driver, _, root = info.strip().partition(" ")
    if driver != "overlay2" or not root:
        return None
    return root if os.path.isdir(os.path.join(root, "image", "overlay2", "layerdb")) else None


def chain_ids(diff_ids: list[str]) -> list[str]:
    """Each layer's chain ID, the name Docker's layer store keeps it under."""
    chain: list[str] = []
    for diff_id in diff_ids:
        chain.append(sha256(f"{chain[-1]} {diff_id}".encode()) if chain else diff_id)
    return chain


class LayerTar:
    """A layer's tar, byte for byte as Docker made it, put together as Docker's own export
    does: the tar headers kept in the layer's tar-split record, and the files' contents read
    from the layer's overlay2 directory."""

    def __init__(self, tar_split: str, diff_dir: str):
        # Each entry is a segment of the tar's own bytes (type 2) or a file's name and size.
        with gzip.open(tar_split, "rt", encoding="utf-8") as lines:
            entries = [json.loads(line) for line in lines if line.strip()]
        self.parts = [base64.b64decode(e["payload"]) if e["type"] == 2 else e for e in entries]
        self.size = sum(len(p) if isinstance(p, bytes) else p.get("size", 0) for p in self.parts)
        self.diff_dir = diff_dir
        self.pieces, self.left = self._pieces(), memoryview(b"")

    def _pieces(self):
        for entry in self.parts:
            if isinstance(entry, bytes):
                yield entry
            elif entry.get("size"):
                name = base64.b64decode(entry["name_raw"]) if "name_raw" in entry else entry["name"]
                path = os.path.join(os.fsencode(self.diff_dir), os.fsencode(name))
                with open(path, "rb") as f:
                    left = entry["size"]
                    while left > 0 and (block := f.read(min(left, CHUNK))):
                        left -= len(block)
                        yield block
                if left:
                    raise RegistryError(f"{path.decode(errors='replace')}: shorter than its tar")

    def read(self, size: int) -> bytes:
        blocks, wanted = [], size
        while wanted > 0:
            if not self.left:
                piece = next(self.pieces, None)
                if piece is None:
                    break
                self.left = memoryview(piece)
            blocks.append(self.left[:wanted])
            wanted -= len(blocks[-1])
            self.left = self.left[len(blocks[-1]) :]
        return b"".join(blocks)


def send_from_store(
    registry: Registry,
    root: str,
    image_id: str,
    diff_ids: list[str],
    sizes: dict[str, int],
    *,
    uploads: int = UPLOADS,
) -> tuple[bytes, int]:
    """Send the layers not in sizes (which gains them) from Docker's overlay2 store, up to
    ``uploads`` at once, the largest first; the config's bytes and the bytes sent."""
    images = os.path.join(root, "image", "overlay2")
    with open(os.path.join(images, "imagedb", "content", "sha256", image_id[7:]), "rb") as f:
        config = f.read()
    if sha256(config) != image_id:
        raise RegistryError(f"Docker's store holds another config under {image_id}")
    chains = zip(diff_ids, chain_ids(diff_ids), strict=True)
    layers = {
        d: os.path.join(images, "layerdb", "sha256", c[7:]) for d, c in chains if d not in sizes
    }
    queue = sorted(layers.items(), key=lambda item: stored_size(item[1]))  # the largest last
    lock = threading.Lock()

    def send_some(connection: Registry) -> None:
        """Send layers off the queue over one connection until it is empty; on an error, the
        other connections take no further layer."""
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    diff_id, layer = queue.pop()
                with open(os.path.join(layer, "cache-id"), encoding="ascii") as f:
                    diff_dir = os.path.join(root, "overlay2", f.read().strip(), "diff")
                tar = LayerTar(os.path.join(layer, "tar-split.json.gz"), diff_dir)
                got = connection.put_blob(tar, tar.size)
                if got != diff_id:
                    raise RegistryError(
                        f"layer {diff_id} put together from Docker's store is {got}"
                    )
                with lock:
                    sizes[diff_id] = tar.size
        except BaseException:
            with lock:
                queue.clear()
            raise

    count = max(1, min(uploads, len(queue)))
    connections = [registry] + [registry.another() for _ in range(count - 1)]
    with ThreadPoolExecutor(len(connections)) as pool:
        for done in [pool.submit(send_some, c) for c in connections]:
            done.result()
    return config, sum(sizes[d] for d in layers)


def stored_size(layer: str) -> int:
    """The size of a layer's files as Docker's layer store records it (0 where it does not)."""
    try:
        with open(os.path.join(layer, "size"), encoding="ascii") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def push(
    registry: Registry, root: str, image_id: str, diff_ids: list[str], *, uploads: int = UPLOADS
) -> tuple[bytes, int]:
    """Send what the registry lacks of the local image; its manifest and the bytes sent."""
    held = {d: registry.blob_size(d) for d in dict.fromkeys([image_id, *diff_ids])}
    sizes = {d: size for d, size in held.items() if size is not None}
    config, sent = send_from_store(registry, root, image_id, diff_ids, sizes, uploads=uploads)
    if image_id not in sizes:
        sizes[registry.put_blob(io.BytesIO(config), len(config))] = len(config)
        sent += len(config)
    return manifest(config, [(d, sizes[d]) for d in diff_ids]), sent


# Docker keeps at most this many (digest, repository) entries per layer (its maxMetadata).
DOCKER_METADATA_MAX = 50


def record_in_docker(root: str, name: str, diff_ids: list[str]) -> int:
    """Record in Docker's distribution metadata, as its own push does, that each layer is in
    repository ``name`` (with its registry) under a blob digest equal to its diff ID; how many
    entries were new. Docker reads these files on every push and pull, and writes them by
    renaming a complete file into place, as this does; entries already there are kept."""
    base = os.path.join(root, "image", "overlay2", "distribution")
    if not os.path.isdir(base):  # no push or pull ever ran here; Docker makes it on its first
        return 0
    added = 0
    for diff_id in dict.fromkeys(diff_ids):
        key = diff_id.replace(":", os.sep, 1)  # sha256/<hex>, Docker's file name for the key
        entry = {"Digest": diff_id, "SourceRepository": name, "HMAC": ""}
        by_diff_id = os.path.join(base, "v2metadata-by-diffid", key)
        try:
            with open(by_diff_id, encoding="utf-8") as f:
                entries = json.load(f) or []
        except (FileNotFoundError, ValueError):
            entries = []
        if entry not in entries:
            entries = [*entries, entry][-DOCKER_METADATA_MAX:]
            write_atomically(by_diff_id, json.dumps(entries, separators=(",", ":")).encode())
            added += 1
        by_digest = os.path.join(base, "diffid-by-digest", key)
        try:
            with open(by_digest, encoding="ascii") as f:
                known = f.read()
        except FileNotFoundError:
            known = None
        if known != diff_id:
            write_atomically(by_digest, diff_id.encode())
    return added


def write_atomically(path: str, data: bytes) -> None:
    """Write path whole or not at all (a temporary file beside it, renamed), mode 0644."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    temporary = f"{path}.ddpfleet-{os.getpid()}"
    with open(temporary, "wb") as f:
        f.write(data)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def docker_push(ref: str) -> None:
    run = subprocess.run(["docker", "push", ref], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RegistryError(f"docker push {ref}: {run.stderr.strip()[-500:]}")


def publish(
    registry: Registry,
    ref: str,
    tag: str,
    source_tag: str | None,
    check: bool,
    *,
    uploads: int = UPLOADS,
) -> tuple[bool, bytes | None, int, int]:
    """Whether tag changed, the manifest it points at (None in check mode), the bytes sent,
    the layers newly recorded in this host's Docker as held by the repository."""
    current, root, diff_ids = registry.get_manifest(tag), None, []
    if source_tag:
        source = registry.get_manifest(source_tag)
        if source is None:
            raise RegistryError(f"{ref.rpartition(':')[0]}:{source_tag} is not in the registry")
        (body, media_type), sent = source, 0
    else:
        try:
            image_id, diff_ids, root = local_image(ref)
        except RegistryError:
            if check:  # not built yet, as in a check-mode run: it would be pushed
                return True, None, 0, 0
            raise
        if check:
            return current is None or config_digest(current[0]) != image_id, None, 0, 0
        if root is None:  # an image store this module does not read: Docker's push, gzipped
            docker_push(ref)
            after = registry.get_manifest(tag)
            return after != current, after[0] if after else None, 0, 0
        body, sent = push(registry, root, image_id, diff_ids, uploads=uploads)
        media_type = MANIFEST
    changed = current is None or current[0] != body
    if changed and not check:
        registry.put_manifest(tag, body, media_type)
    # pushed from the store, the manifest names each layer by its diff ID: tell Docker so
    recorded = record_in_docker(root, ref.rpartition(":")[0], diff_ids) if root else 0
    return changed, body, sent, recorded


def config_digest(body: bytes) -> str | None:
    return json.loads(body).get("config", {}).get("digest")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "tag": {"type": "str", "required": True},
            "source_tag": {"type": "str"},
            "docker_config": {"type": "path", "default": "/root/.docker/config.json"},
            "timeout": {"type": "int", "default": 300},
            "uploads": {"type": "int", "default": UPLOADS},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["uploads"] < 1:
        module.fail_json(msg=f"uploads: {p['uploads']}: at least 1 layer must be sent at a time")
    try:
        host, repository = split_name(p["name"])
        registry = Registry(host, repository, login(p["docker_config"], host), p["timeout"])
        changed, body, sent, recorded = publish(
            registry,
            f"{p['name']}:{p['tag']}",
            p["tag"],
            p["source_tag"],
            module.check_mode,
            uploads=p["uploads"],
        )
    except (
        RegistryError,
        ValueError,
        OSError,
        http.client.HTTPException,
        subprocess.SubprocessError,
    ) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(
        changed=changed, digest=body and sha256(body), sent_bytes=sent, recorded_layers=recorded
    )


if __name__ == "__main__":
    main()
