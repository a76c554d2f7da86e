"""The run agent: PID 1 of every run container, supervising its host's ranks.

``python -m ddpfleet_agent --run-dir D --run-id R --host H --node-rank N --hosts h0,h1,...
--store ADDR:PORT --key-file F [options] -- torchrun ... -m trainer ...``: ``--help`` lists the
options (cli.py); the train_* ones take their defaults and ranges from trainer/options.py.

One agent per host; node rank 0's serves the run's store (store.py, standard library only: the
agent imports no torch) at ``--store``. Each agent:

- starts the command in its own session with ``DDPFLEET_HEARTBEAT_DIR`` set to a
  container-local directory, and copies its output to stdout and ``nodes/<host>.log``;
- publishes its ranks' step, phase and heartbeat ages in the store with a keepalive counter;
- claims the first failure in the store (compare-and-set: every host names the same cause)
  and kills its ranks when it sees one: a rank that exited non-zero, a host whose keepalive
  stopped, a lost store, a frozen rank or a hang (failures.py);
- on SIGTERM/SIGINT asks every agent through the store to stop: each signals its ranks (which
  checkpoint and exit) and escalates to SIGKILL after ``--stop-timeout``;
- writes ``nodes/<host>.exit``; node rank 0 (or, when it is gone, the hosts that lost it)
  keeps ``progress.json`` current; at the end it writes ``summary.json``, ``report.txt`` and
  ``report.png`` of a completed run, then the last ``progress.json`` with the run's
  ``status`` (completed, stopped or failed: what train.yml and status.yml read).

Nothing needs the controller: the run goes on and ends the same way without it.
"""
