from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.config import BadInputError, TrainConfig
from trainer.model import (
    build_model,
    build_optimizer,
    grad_scaler,
    lr_factor,
    resolve_amp,
    scaled_lr,
    wrap_ddp,
)

CPU = torch.device("cpu")


def test_linear_scaling_rule() -> None:
    assert scaled_lr(0.1, 1024) == pytest.approx(0.4)


def test_warmup_is_linear_then_cosine_decays_to_zero() -> None:
    f = lr_factor(total_steps=100, warmup_steps=10, decay="cosine")
    assert [f(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert f(55) == pytest.approx(0.5)
    assert f(100) == pytest.approx(0.0)


def test_step_decay_divides_by_ten_at_30_60_80_percent() -> None:
    f = lr_factor(total_steps=100, warmup_steps=0, decay="step")
    assert [f(s) for s in (0, 29, 30, 60, 80)] == pytest.approx([1, 1, 0.1, 0.01, 0.001])


def test_warmup_is_capped_at_a_quarter_of_the_run() -> None:
    assert lr_factor(total_steps=8, warmup_steps=100, decay="cosine")(1) == pytest.approx(1.0)


def test_no_weight_decay_on_batchnorm_and_bias() -> None:
    model = build_model("resnet18", 4)
    opt = build_optimizer(model, TrainConfig(weight_decay=1e-4), lr=0.1)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 1e-4
    assert no_decay["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decay["params"])
    bn_and_bias = {id(model.bn1.weight), id(model.bn1.bias), id(model.fc.bias)}
    assert bn_and_bias <= {id(p) for p in no_decay["params"]}
    assert opt.defaults["nesterov"] is True
    assert opt.defaults["momentum"] == 0.9


def test_resnet50_zero_initialises_the_last_bn_of_each_block() -> None:
    model = build_model("resnet50", 10)
    assert torch.count_nonzero(model.layer1[0].bn3.weight) == 0
    assert model.fc.out_features == 10


def test_unknown_arch_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="--arch nonet"):
        build_model("nonet", 10)


def test_amp_auto_uses_bf16_on_a_bf16_cpu() -> None:
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert resolve_amp("auto", CPU) is None
    else:
        assert resolve_amp("auto", CPU) is torch.bfloat16
    assert resolve_amp("off", CPU) is None


def test_grad_scaler_only_for_fp16() -> None:
    assert grad_scaler(CPU, torch.float16).is_enabled()
    assert not grad_scaler(CPU, torch.bfloat16).is_enabled()


def test_wrap_ddp_leaves_a_world_of_one_unwrapped() -> None:
    model = torch.nn.Linear(2, 2)
    assert wrap_ddp(model, torch.device("cpu"), 1) is model


def test_wrap_ddp_wraps_with_bucket_views_and_a_static_graph(tmp_path: Path) -> None:
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wrapped = wrap_ddp(torch.nn.Linear(2, 2), torch.device("cpu"), 2)
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
        assert wrapped.gradient_as_bucket_view
        assert wrapped.static_graph
    finally:
        torch.distributed.destroy_process_group()
