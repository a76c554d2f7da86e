# ruff: noqa: E501
"""Generated from trainer/options.py by tools/gen_options.py (make generate): do not edit.

The run agent's flags that are train_* options, with the declaration's type, default,
range (the agent's own floor where it has one) and help; ddpfleet_agent.cli builds its
parser from them. Generated, not imported: the agent imports no trainer (train.yml ships
it alone into a user's image)."""

# (flag, type, default, min, max, train_* option, help)
# fmt: off
FLAGS: tuple[tuple, ...] = (
    ('--program', 'str', '', None, None, 'train_program', "Your own DDP program instead of ddpfleet's trainer: a Python module (pkg.train, run as torchrun ... -m pkg.train) or a script path ending in .py, in train_code_dir or in the image. The trainer's options (data, optimisation, speed, checkpoints) then do not apply."),
    ('--heartbeat-timeout', 'int', 300, 1, 604800, 'train_heartbeat_timeout', 'Seconds a rank may go frozen (its heartbeat thread silent) or, in training or validation, without progress before the agents fail the run; data-set scans, validation and checkpoint saves keep beating.'),
    ('--restarts', 'int', 2, 0, 1000, 'train_restarts', "Restarts, with no controller: after a rank's failure on a host that is still there (a crash, a killed or frozen rank), the agents restart every rank in place from the newest checkpoint; after a host is gone, without it (train_min_hosts); at most this many times in the run, and not after bad input, a non-finite loss, or the same rank failing again at the same step. 0: the first failure ends the run."),
    ('--min-hosts', 'int', 0, 0, 100000, 'train_min_hosts', "Shrink instead of failing: a host gone (silent past train_peer_timeout: cut off, its container killed) is left out and the others restart from the newest checkpoint while at least this many remain, with the same global batch (split again, by the balance weights when train_balance is on; gradient accumulation where a rank's share outgrows its first one). Node rank 0's host may be lost too (the lowest-ranked host left serves the agents' store and torchrun's from then on). Needs train_restarts. 0: every trainer (no shrinking)."),
    ('--rebalance', 'str', 'auto', None, None, 'train_rebalance', "Stragglers: auto (node rank 0's agent watches each host's own time per image, its data wait and forward pass; when a host's step, by the median of its last 5 log intervals, is at least 1.3x the balanced one twice in a row, at most 4 times an hour, the ranks restart at the next checkpoint with shares proportional to the hosts' speeds, and give a share back once the host is fast again; a host under 0.25x is left out instead where train_min_hosts allows, and taken back once doctor's compute check in place is twice as fast as when it was left out, or a third as fast as the median host was then: same global batch, not counted in train_restarts) or off. ddpfleet's trainer only, with checkpoints."),
    ('--peer-timeout', 'int', 60, 1, 604800, 'train_peer_timeout', "Seconds without a peer agent's keepalive before that host counts as failed (at least 5)."),
    ('--max-runtime', 'int', 604800, 60, 31622400, 'train_max_runtime', 'The agents fail the run if it is still going after this many seconds (default: 7 days).'),
    ('--stop-timeout', 'int', 90, 1, 86400, 'train_stop_timeout', 'Grace period of a stop: the agents SIGTERM their ranks and SIGKILL them after this many seconds; stop.yml waits this plus 30 s for every container to be gone. Keep it above one log interval plus the longest checkpoint save.'),
    ('--log-tail-lines', 'int', 20, 0, 100000, 'train_log_tail_lines', "Lines of the failing rank's log kept in summary.json's failure."),
    ('--straggler-ratio', 'float', 0.9, 0.0, 1.0, 'train_straggler_ratio', 'A rank below this fraction of the median img/s is flagged as a straggler in the report.'),
)
# fmt: on
