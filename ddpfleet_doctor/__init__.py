"""ddpfleet's cluster diagnostics, run in the training image: the doctor's checks (doctor.yml,
``train_doctor``) and train.yml's GPU preflight check.

The doctor, one JSON line on stdout per check (see ddpfleet_doctor.cli)::

    python -m ddpfleet_doctor compute --arch resnet50 --image-size 224 --batch-size 0 --amp auto
    python -m ddpfleet_doctor storage --data-dir /mnt/ddpfleet/datasets --host-index 0 --hosts 3
    torchrun ... -m ddpfleet_doctor network --names n1,n2 --addresses 10.0.0.1,10.0.0.2

The GPU check, one line, exit 0 when the host's GPUs can train (see ddpfleet_doctor.gpucheck)::

    python -m ddpfleet_doctor.gpucheck --host node1 --gpus 8 --min-capability 7.5

Modules: ``cli`` (the doctor's command line), one per check (``compute``, ``storage``,
``network``), ``gpuhealth`` (nvidia-smi health, sampled by ``compute``), ``gpucheck``,
``gpuplan`` (the compute-capability floor) and ``hostcheck`` (names, ports, /dev/shm, the CPU
quota, RDMA memlock): train.yml's preflight modules import these two files through
roles/trainer_run/module_utils, on hosts without the packages. The checks may import from
``trainer`` (``compute`` trains its model); ``trainer`` and ``ddpfleet_agent`` import nothing
from this package.
"""
