"""The sandbox cluster: node containers that ddpfleet's playbooks treat like servers.

Run from the repository root (``make sandbox`` / ``make sandbox-down`` do this)::

    python -m sandbox up [--nodes N] [--subnet CIDR]   # create or repair; writes the inventory
    python -m sandbox status                           # nodes, IPs, storage mode
    python -m sandbox down [--purge]                   # remove all it made (--purge: caches)
    python -m sandbox images                           # only build the node images up needs

Then ``ansible-playbook -i inventory/sandbox/hosts.yml site.yml`` provisions it.
Defaults come from ``SANDBOX_NODES`` (3) and ``SANDBOX_SUBNET`` (10.213.97.0/24);
``SANDBOX_BOOT_TIMEOUT`` (120 s), ``SANDBOX_IMAGE_BUILDER`` (auto|dockerfile|debootstrap)
and ``SANDBOX_BASE_IMAGE`` (debian:bookworm) tune the build and boot.
See ``sandbox/README.md`` for how a node is made and why.
"""
