"""Filters of the trainer_run role for unequal hosts, from trainer/shares.py: train_balance's
mode, the doctor's throughput for this run's model, and the trainer's per-rank --batch-weights
(the checks of train_balance and train_cpus are the ddpfleet_run_validate action's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # this checkout's trainer package
from trainer.shares import balance_mode, doctor_speeds, rank_weights


class FilterModule:
    """ddpfleet trainer_run filters for unequal hosts."""

    def filters(self) -> dict:
        return {
            "ddpfleet_balance_mode": balance_mode,
            "ddpfleet_doctor_speeds": doctor_speeds,
            "ddpfleet_rank_weights": rank_weights,
        }
