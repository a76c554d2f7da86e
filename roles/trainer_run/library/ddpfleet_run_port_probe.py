#!/usr/bin/python
"""Listen on the run's ports for a while and record which peers connected to each."""

from __future__ import annotations

import selectors
import time
from collections import Counter

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ddpfleet_hostcheck import bind

DOCUMENTATION = r"""
module: ddpfleet_run_port_probe
short_description: Prove the run's ports are free on rank 0's host and reachable from peers
description:
- Binds every port, accepts connections on those it could bind until each C(expect) address
  connected to each or C(timeout) passed, then closes them; fails with one line naming each
  busy port. Meant to
  run with async while the peers connect with ansible.builtin.wait_for.
options:
  host:
    description: inventory_hostname (for messages).
    type: str
    required: true
  ports:
    description: "The ports by name, e.g. {rendezvous: 29500, agent: 29501}."
    type: dict
    required: true
  expect:
    description: Peer addresses expected to connect to every port.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds to wait for them.
    type: float
    default: 30
author: ddpfleet
"""

RETURN = r"""
missing:
  description: 'Each expected address that did not connect to every port, with the ports it missed
    (e.g. {"10.0.0.12": ["agent port 29501"]}).'
  type: dict
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "ports": {"type": "dict", "required": True},
            "expect": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "float", "default": 30},
        },
        supports_check_mode=False,
    )
    p = module.params
    sel, busy = selectors.DefaultSelector(), []
    for name, port in p["ports"].items():
        sock, why = bind(port)
        if sock is None:
            busy.append(f"{name} port {port} {why} on {p['host']}")
            continue
        sock.listen(64)
        sel.register(sock, selectors.EVENT_READ, name)
    # Count connections per address: several hosts may share one (e.g. behind NAT). A busy
    # port's peers reach whoever holds it; the free ones are still served, so the peers' waits
    # end at once and the refusal comes in seconds, not after the whole timeout.
    want = Counter(p["expect"])
    connected = {key.data: Counter() for key in sel.get_map().values()}
    deadline = time.time() + p["timeout"]
    while any(want - c for c in connected.values()) and time.time() < deadline:
        for key, _ in sel.select(timeout=max(0.1, deadline - time.time())):
            conn, addr = key.fileobj.accept()
            connected[key.data][addr[0]] += 1
            conn.close()
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    if busy:
        module.fail_json(msg="; ".join(busy))
    missing: dict[str, list[str]] = {}
    for name, c in connected.items():
        for addr in sorted(want - c):
            missing.setdefault(addr, []).append(f"{name} port {p['ports'][name]}")
    module.exit_json(changed=False, missing=missing)


if __name__ == "__main__":
    main()
