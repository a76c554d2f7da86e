#!/usr/bin/python
"""Listen on the rendezvous port for a while and record which peers connected."""

from __future__ import annotations

import errno
import socket
import time
from collections import Counter

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ddpfleet_run_port_probe
short_description: Prove the rendezvous port is free on rank 0's host and reachable from peers
description:
- Binds the port (fails with one line when it is busy), accepts connections until C(expect)
  distinct peer addresses connected or C(timeout) passed, then closes it. Meant to run with
  async while the peers connect with ansible.builtin.wait_for.
options:
  host:
    description: inventory_hostname (for messages).
    type: str
    required: true
  port:
    description: The rendezvous port.
    type: int
    required: true
  expect:
    description: Peer addresses expected to connect.
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
connected:
  description: Peer addresses that connected.
  type: list
  returned: always
missing:
  description: Expected addresses that never connected.
  type: list
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "port": {"type": "int", "required": True},
            "expect": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "float", "default": 30},
        },
        supports_check_mode=False,
    )
    p = module.params
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", p["port"]))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            module.fail_json(msg=f"rendezvous port {p['port']} is busy on {p['host']}")
        module.fail_json(msg=f"cannot bind rendezvous port {p['port']} on {p['host']}: {exc}")
    sock.listen(64)
    # Count connections per address: several hosts may share one (e.g. behind NAT).
    connected: Counter[str] = Counter()
    deadline = time.time() + p["timeout"]
    want = Counter(p["expect"])
    while any(connected[a] < n for a, n in want.items()) and time.time() < deadline:
        sock.settimeout(max(0.1, deadline - time.time()))
        try:
            conn, addr = sock.accept()
        except TimeoutError:
            break
        connected[addr[0]] += 1
        conn.close()
    sock.close()
    missing = sorted(want - connected)
    module.exit_json(changed=False, connected=sorted(connected), missing=missing)


if __name__ == "__main__":
    main()
