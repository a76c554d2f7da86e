"""The run agent: PID 1 of every run container, supervising its host's ranks.

``python -m ddpfleet_agent --run-dir D --run-id R --host H --node-rank N --hosts h0,h1,...
--store ADDR:PORT --key-file F [options] -- torchrun ... -m trainer ...``: ``--help`` lists the
options (cli.py); those that are train_* options take their defaults and ranges from the one
declaration, trainer/options.py, through the table it generates here (options.py).

One agent per host. Node rank 0's agent serves the run's store (store.py, standard library
only: the agent imports no torch) at ``--store``; every agent connects to it. Each agent:

- starts the command (torchrun) in its own session with ``DDPFLEET_HEARTBEAT_DIR`` set to a
  container-local directory, copies its output to stdout and ``nodes/<host>.log``;
- reads its ranks' heartbeat files there (about once a second, nothing on shared storage) and
  publishes their step, phase and ages in the store with a keepalive counter;
- puts the first failure (host, rank, exit code, reason) into the store (compare-and-set: the
  first claim wins) and kills its ranks as soon as it sees one: a rank that exited non-zero,
  a host whose keepalive stopped (``--peer-timeout``), a lost store connection (the store's
  host failed), a frozen rank (heartbeat thread silent for ``--heartbeat-timeout``), or a hang
  (no rank progressed for ``--heartbeat-timeout``: the rank whose step stopped first is named);
- on SIGTERM/SIGINT asks every agent through the store to stop: each signals its ranks (which
  checkpoint and exit) and escalates to SIGKILL itself after ``--stop-timeout``;
- writes ``nodes/<host>.exit``; node rank 0 (or, when it is gone, the hosts that lost it)
  writes ``summary.json`` once, at the run's end: the trainer's part of it
  (``summary.trainer.json``), the run's outcome and attempts (``summary.py``); node rank 0
  keeps ``progress.json`` current; its last
  ``progress.json`` has the run's ``status`` (completed, stopped or failed, from every host's
  exit: what train.yml and status.yml read), after ``report.txt`` and ``report.png`` of a
  completed run (``ddpfleet_agent.report``; ``--straggler-ratio``).

Nothing needs the controller: the run goes on and ends the same way without it.
"""
