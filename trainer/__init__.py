"""ddpfleet's data-parallel trainer: ResNet-50 (any torchvision classifier) on ImageFolder
or synthetic data, with AMP, channels_last, atomic checkpoints, resume and clean stops.

One process (CPU or one GPU)::

    python -m trainer --synthetic --num-classes 10 --image-size 112 --batch-size 16 \\
        --max-steps 50 --output-dir runs/try

One host, all its GPUs (or N CPU ranks on gloo)::

    torchrun --standalone --nproc-per-node gpu -m trainer \\
        --data-dir /mnt/ddpfleet/datasets/demo --epochs 5 --output-dir runs/one-host

Several hosts (run on every host; node 0's address as the rendezvous endpoint)::

    torchrun --nnodes 2 --node-rank <0|1> --nproc-per-node 8 \\
        --rdzv-backend static --master-addr 10.0.0.11 --master-port 29500 \\
        -m trainer --data-dir /mnt/ddpfleet/datasets/demo --epochs 90 \\
        --output-dir /mnt/ddpfleet/runs/<run_id>

A demo data set (JPEG files, nothing downloaded)::

    python -m trainer.make_dataset --out /tmp/demo --classes 4 --train-per-class 32 \\
        --val-per-class 8 --size 64

Outputs in ``--output-dir``: ``metrics.jsonl`` and ``summary.json`` (rank 0, at the end;
under ``ddpfleet_agent``, which sets ``$DDPFLEET_HEARTBEAT_DIR``, rank 0 writes
``summary.trainer.json`` instead and the agent writes summary.json from it with the run's
outcome and attempts: ``ddpfleet_agent/summary.py``), ``checkpoints/step-<step>.pt``,
``logs/rank-<rank>.log``. Each rank's heartbeat,
``rank-<rank>.json`` (step, phase, liveness and progress times, last loss and img/s), is
rewritten every ``$DDPFLEET_HEARTBEAT_INTERVAL`` s (default 1) by a thread (the heartbeat
helper user programs get, ``ddpfleet_agent/ddpfleet_heartbeat.py``), in
``$DDPFLEET_HEARTBEAT_DIR`` (set by ``ddpfleet_agent``, inside the container) or else in
``<output-dir>/heartbeat/``. A stop signal is agreed at the next ``--log-every`` step
(or validation batch), then the ranks checkpoint and exit.
Exit codes: 0 completed, 1 failed, 2 bad input, 143/130 stopped by SIGTERM/SIGINT after a
checkpoint. ``--resume auto`` (default) continues from the newest complete checkpoint.
"""

__version__ = "0.1.0"
