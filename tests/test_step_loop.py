""" The shared optimizer update (mlp_vision/training/loop.py: StepLoop, used by the image epoch and the text steps)
and the shared backbone loader (mlp_vision/weights.py: load_backbone, used by image fine-tuning, text
from_pretrained and the text classifier's --init-from). Small models, CPU, a few seconds. """
import copy

import pytest
import torch
import torch.nn as nn

import mlp_vision.text as mt
from mlp_vision.errors import Interrupted
from mlp_vision.training.loop import StepLoop
from mlp_vision.training.run import NonFiniteLossError, UpdateStep
from mlp_vision.weights import load_backbone


def _loop(model, **kwargs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return StepLoop(model, model, UpdateStep(optimizer, model.parameters, None, 0.), **kwargs), optimizer


def _regression():
    torch.manual_seed(0)
    return nn.Linear(4, 1), torch.randn(8, 4), torch.randn(8, 1)


def test_accumulated_micro_batches_give_the_update_of_one_big_batch():
    model, x, y = _regression()
    big = copy.deepcopy(model)
    loop, _ = _loop(model)
    chunks = iter(zip(x.chunk(4), y.chunk(4)))

    def micro_loss():
        xb, yb = next(chunks)
        return nn.functional.mse_loss(model(xb), yb)

    losses = loop.update(micro_loss, 4, stopped_at='step 0', loss_at=lambda m: f'step 1 (micro-batch {m})')
    assert len(losses) == 4 and loop.num_updates == 1
    big_loop, _ = _loop(big)
    big_loop.update(lambda: nn.functional.mse_loss(big(x), y), 1, stopped_at='step 0', loss_at=str)
    for a, b in zip(model.parameters(), big.parameters()):
        torch.testing.assert_close(a, b)


def test_a_non_finite_loss_stops_before_the_update_with_one_line():
    model, x, y = _regression()
    before = copy.deepcopy(model.state_dict())
    loop, _ = _loop(model)
    losses = iter([nn.functional.mse_loss(model(x), y), torch.tensor(float('nan'), requires_grad=True)])
    with pytest.raises(NonFiniteLossError) as e:
        loop.update(lambda: next(losses), 2, stopped_at='step 0', loss_at=lambda m: f'step 1 (micro-batch {m})')
    assert str(e.value) == 'training loss is nan at step 1 (micro-batch 1); stopped before applying it'
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and loop.num_updates == 0


def test_ema_and_schedule_advance_once_per_optimizer_update():
    model, x, y = _regression()
    calls = []

    class Recorder:
        def update(self, m, step):
            calls.append(('ema', step))

        def step_update(self, num_updates, metric=None):
            calls.append(('sched', num_updates))
            metrics.append(metric)

    metrics = []
    loop, _ = _loop(model, model_ema=Recorder(), lr_scheduler=Recorder())
    for _ in range(3):
        losses = loop.update(lambda: nn.functional.mse_loss(model(x), y), 2, stopped_at='', loss_at=str,
                             metric=lambda ls: sum(ls) / len(ls))
        assert metrics[-1] == sum(losses) / len(losses)  # the scheduler gets the value, not the function
    assert calls == [('ema', 1), ('sched', 1), ('ema', 2), ('sched', 2), ('ema', 3), ('sched', 3)]


def test_a_stop_signal_raises_before_any_micro_batch():
    model, x, y = _regression()
    loop, _ = _loop(model, stop_signal=lambda: 2)
    with pytest.raises(Interrupted, match='interrupted by SIGINT at step 7'):
        loop.update(lambda: pytest.fail('no micro-batch after a stop signal'), 1, stopped_at='step 7', loss_at=str)


# ------------------------------------------------------------------------------------------------ backbone loader
TINY_BERT = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=16)


def test_load_backbone_reports_loaded_new_unused_and_replaces_the_head():
    torch.manual_seed(0)
    mlm = mt.create_model('bert_small', **TINY_BERT)
    classifier = mt.create_model('bert_small', task='sequence_classification', num_labels=3, **TINY_BERT)
    head = {k: v.clone() for k, v in classifier.state_dict().items() if k.startswith(classifier.head_prefixes)}
    report = load_backbone(classifier, mlm.state_dict(), classifier.head_prefixes)
    own = classifier.state_dict()
    assert report.loaded and not report.missing and not report.mismatched
    assert set(report.loaded) | set(report.new) == set(own)
    assert report.new and all(k.startswith(classifier.head_prefixes) for k in report.new)
    assert report.unused and all(k not in own for k in report.unused)  # the MLM head
    for k in report.loaded:
        torch.testing.assert_close(own[k], mlm.state_dict()[k])
    for k, v in head.items():  # the new head keeps its init
        torch.testing.assert_close(own[k], v)


def test_load_backbone_keeps_a_head_of_another_shape_new_and_reports_missing_backbone():
    torch.manual_seed(0)
    two = mt.create_model('bert_small', task='sequence_classification', num_labels=2, **TINY_BERT)
    three = mt.create_model('bert_small', task='sequence_classification', num_labels=3, **TINY_BERT)
    sd = two.state_dict()
    dropped = next(k for k in sd if not k.startswith(three.head_prefixes))
    del sd[dropped]
    report = load_backbone(three, {f'module.{k}': v for k, v in sd.items()}, three.head_prefixes)  # DDP keys
    assert report.missing == [dropped]
    assert report.mismatched and set(report.mismatched) <= set(report.new) <= set(report.unused) | set(report.new)
    assert report.mismatched_outside(three.head_prefixes) == []
    assert report.mismatched_outside(()) == report.mismatched  # no head: a mis-shaped tensor is the caller's error
