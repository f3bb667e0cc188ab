""" The shared optimizer update (mlp_vision/training/loop.py: StepLoop, used by the image epochs):
its result, its NaN and signal stops, and where it waits (host syncs and collectives counted per update and per
evaluation, in a real one-process gloo group); and the shared backbone loader (mlp_vision/weights.py: load_backbone,
used by image fine-tuning, text from_pretrained and the text classifier's --init-from). Small models, CPU, a few
seconds. """
import collections
import copy
import os
import signal
import types

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import mlp_vision.text as mt
import mlp_vision.train as image_train
import mlp_vision.training.loop as loop_module
from mlp_vision.errors import Interrupted, UsageError
from mlp_vision.training.image_model import process_group_backend
from mlp_vision.training.loop import NonFiniteLossError, StepLoop, UpdateStep
from mlp_vision.training.run_files import stop_signals
from mlp_vision.training.image_model import validate
from mlp_vision.weights import load_backbone


def _loop(model, **kwargs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return StepLoop(model, model, UpdateStep(optimizer, model.parameters, None, 0.), **kwargs), optimizer


def _regression():
    torch.manual_seed(0)
    return nn.Linear(4, 1), torch.randn(8, 4), torch.randn(8, 1)


def test_accumulated_micro_batches_give_the_update_of_one_big_batch():
    model, x, y = _regression()
    big, model_before = copy.deepcopy(model), copy.deepcopy(model)
    loop, _ = _loop(model)
    chunks = iter(zip(x.chunk(4), y.chunk(4)))

    def micro_loss():
        xb, yb = next(chunks)
        return nn.functional.mse_loss(model(xb), yb)

    losses = loop.update(micro_loss, 4, stopped_at='step 0', loss_at=lambda m: f'step 1 (micro-batch {m})')
    assert losses.micro_batches == 4 and loop.num_updates == 1
    assert losses.mean == pytest.approx(sum(nn.functional.mse_loss(model_before(xb), yb).item()
                                            for xb, yb in zip(x.chunk(4), y.chunk(4))) / 4)
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
                             metric=lambda u: u.mean)
        assert metrics[-1] == losses.mean  # the scheduler gets the value, not the function
    assert calls == [('ema', 1), ('sched', 1), ('ema', 2), ('sched', 2), ('ema', 3), ('sched', 3)]


def test_a_stop_signal_raises_before_any_micro_batch():
    model, x, y = _regression()
    loop, _ = _loop(model, stop_signal=lambda: 2)
    with pytest.raises(Interrupted, match='interrupted by SIGINT at step 7'):
        loop.update(lambda: pytest.fail('no micro-batch after a stop signal'), 1, stopped_at='step 7', loss_at=str)


def test_a_stop_signal_inside_a_long_update_abandons_it():
    """One process reads its flag before every micro-batch: a signal at micro-batch 3 of 1,000,000 stops there (issue
    33: --grad-accum-steps 1e9 ignored SIGTERM for 26 minutes), the weights stay as before the update, the update's
    gradients are dropped."""
    model, x, y = _regression()
    before = copy.deepcopy(model.state_dict())
    calls, flag = [], [0]

    def micro_loss():
        calls.append(1)
        if len(calls) == 3:
            flag[0] = 15  # SIGTERM arrives during micro-batch 2
        return nn.functional.mse_loss(model(x), y)

    loop, _ = _loop(model, stop_signal=lambda: flag[0])
    with pytest.raises(Interrupted, match='interrupted by SIGTERM at step 4'):
        loop.update(micro_loss, 1_000_000, stopped_at='step 4', loss_at=str)
    assert len(calls) == 3 and loop.num_updates == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_stop_signal_during_the_last_micro_batch_lets_the_update_finish_and_stops_the_next():
    model, x, y = _regression()
    before = copy.deepcopy(model.state_dict())
    calls, flag = [], [0]

    def micro_loss():
        calls.append(1)
        if len(calls) == 2:
            flag[0] = 2
        return nn.functional.mse_loss(model(x), y)

    # the flag, read before each micro-batch, is seen at the update's agreement (before the last backward pass)
    loop, _ = _loop(model, stop_signal=lambda: flag[0])
    loop.update(micro_loss, 2, stopped_at='step 0', loss_at=str)
    assert loop.num_updates == 1 and loop.stop_pending == 2
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(Interrupted, match='interrupted by SIGINT at step 1'):
        loop.update(micro_loss, 2, stopped_at='step 1', loss_at=str)
    assert len(calls) == 2


def test_a_non_finite_loss_names_its_micro_batch_and_drops_the_update():
    model, x, y = _regression()
    before = copy.deepcopy(model.state_dict())
    loop, _ = _loop(model)
    losses = iter([torch.tensor(float('inf'), requires_grad=True)] + [nn.functional.mse_loss(model(x), y)] * 2)
    with pytest.raises(NonFiniteLossError, match=r'^training loss is inf at step 1 \(micro-batch 0\)'):
        loop.update(lambda: next(losses), 3, stopped_at='step 0', loss_at=lambda m: f'step 1 (micro-batch {m})')
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and loop.num_updates == 0
    assert all(p.grad is None for p in model.parameters())


# ------------------------------------------------------------------------------------------- host syncs, collectives
HOST_SYNCS = ('item', 'tolist', '__float__', '__int__', '__bool__', '__index__', 'cpu', 'numpy')
COLLECTIVES = ('all_reduce', 'all_gather', 'all_gather_object', 'broadcast', 'broadcast_object_list', 'barrier',
               'reduce', 'all_gather_into_tensor', 'reduce_scatter_tensor')


@pytest.fixture
def one_rank_group():
    """A real one-process gloo group (DDP and every collective run; nothing leaks into other tests)."""
    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def record(monkeypatch):
    """Counts host syncs (Tensor.item / tolist / float() / bool() / ...) and torch.distributed collectives, and the
    device of every tensor a collective gets: ``record.calls`` (a Counter), ``record.devices``, ``record.log``."""
    rec = types.SimpleNamespace(calls=collections.Counter(), devices=[], log=[])
    for name in HOST_SYNCS:
        def sync(self, *a, _real=getattr(torch.Tensor, name), _name=name, **k):
            rec.calls[_name] += 1
            return _real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, sync)
    for name in COLLECTIVES:
        def collective(*a, _real=getattr(dist, name), _name=name, **k):
            rec.calls[_name] += 1
            rec.log.append(_name)
            rec.devices += [t.device for t in list(a) + list(k.values()) if isinstance(t, torch.Tensor)]
            return _real(*a, **k)
        monkeypatch.setattr(dist, name, collective)
    return rec


def _ddp_loop(micro_batches_seen=None, **kwargs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))  # a buffer: DDP broadcasts it
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = StepLoop(model, ddp, UpdateStep(optimizer, model.parameters, None, 1.), distributed=True,
                    device=torch.device('cpu'), **kwargs)
    data = torch.Generator().manual_seed(1)

    def micro_loss():
        if micro_batches_seen is not None:
            micro_batches_seen.append(1)
        x = torch.randn(8, 4, generator=data)
        return nn.functional.mse_loss(ddp(x), x[:, :1])
    return loop, micro_loss


@pytest.mark.parametrize('micro_batches', [2, 8])
def test_ddp_updates_sync_once_per_update_not_per_micro_batch(micro_batches, one_rank_group, record):
    """Under DDP: one collective per update (the loop's agreement; DDP's own gradient reduction is not a
    torch.distributed call), its tensor on the training device, and the same host syncs per update whatever the
    number of micro-batches."""
    loop, micro_loss = _ddp_loop(agree_every_s=60.)
    loop.update(micro_loss, micro_batches, stopped_at='', loss_at=str)  # the first update also measures the time
    record.calls.clear(), record.devices.clear()
    for _ in range(3):
        loop.update(micro_loss, micro_batches, stopped_at='', loss_at=str)
    assert record.calls['all_reduce'] == 3 and sum(record.calls[c] for c in COLLECTIVES) == 3
    assert record.devices == [loop.device] * 3
    assert record.calls['tolist'] == 3 and sum(record.calls[s] for s in HOST_SYNCS) == 3, record.calls


@pytest.mark.parametrize('batches', [8, 16])
def test_an_image_epoch_syncs_once_per_update(batches, one_rank_group, record):
    """The image epoch adds one all-reduce and one host sync per epoch (its loss over the ranks) to the loop's one
    per update; its loss is the sample-weighted mean of its batches' losses."""
    loop, _ = _ddp_loop(agree_every_s=60.)
    torch.manual_seed(2)
    loader = [(x, x[:, :1]) for x in (torch.randn(8 if i % 2 else 3, 4) for i in range(batches))]
    image_train.train_one_epoch(0, loop, loader, nn.functional.mse_loss, total_epochs=2, grad_accum_steps=4)
    record.calls.clear(), record.devices.clear()
    loop.update_step.optimizer.param_groups[0]['lr'] = 0.  # fixed weights: the reference losses below are the same
    metrics = image_train.train_one_epoch(1, loop, loader, nn.functional.mse_loss, total_epochs=2,
                                          grad_accum_steps=4, log_interval=1)
    updates = batches // 4
    assert loop.num_updates == 2 * updates
    assert record.calls['all_reduce'] == updates + 1 and set(record.devices) == {loop.device}
    assert sum(record.calls[s] for s in HOST_SYNCS) == updates + 1, record.calls
    with torch.no_grad():  # train mode, as in the epoch: BatchNorm normalises by each batch's own statistics
        ref = [(len(x), nn.functional.mse_loss(loop.train_model(x), y).item()) for x, y in loader]
    assert metrics['loss'] == pytest.approx(sum(n * l for n, l in ref) / sum(n for n, _ in ref), rel=1e-6)


def test_long_updates_agree_every_few_seconds_and_a_stop_abandons_them_on_every_rank(one_rank_group, record,
                                                                                    monkeypatch):
    """The agreements inside a long update are spaced by the agreed time of a micro-batch (a fake clock: 0.5 s
    each, agree every 2 s -> every 4 micro-batches), so every rank calls them at the same micro-batches; a stop
    signal is acted on at the next one, within ~2 s, and abandons the update."""
    clock = [0.]
    monkeypatch.setattr(loop_module, 'time', types.SimpleNamespace(perf_counter=lambda: clock[0]))
    seen, flag = [], [0]
    loop, micro_loss = _ddp_loop(seen, agree_every_s=2., stop_signal=lambda: flag[0])

    def timed_micro_loss():
        clock[0] += 0.5
        if len(seen) == 25:  # the signal arrives during the third update's second micro-batch
            flag[0] = 15
        return micro_loss()

    def agreed_at():  # micro-batches done at each collective
        at = []
        monkeypatch.setattr(loop, '_agree', lambda *a, _real=loop._agree: (at.append(len(seen)), _real(*a))[1])
        return at

    at = agreed_at()
    loop.update(timed_micro_loss, 12, stopped_at='', loss_at=str)
    assert at == [1, 2, 6, 10, 12]  # 1 and 2: the time of a micro-batch is not known yet
    at = agreed_at()
    loop.update(timed_micro_loss, 12, stopped_at='', loss_at=str)
    assert [a - 12 for a in at] == [4, 8, 12]
    weights = copy.deepcopy(dict(loop.model.named_parameters()))  # (BatchNorm's statistics move in any forward)
    with pytest.raises(Interrupted, match='interrupted by SIGTERM at step 2'):
        loop.update(timed_micro_loss, 1_000_000, stopped_at='step 2', loss_at=str)
    assert len(seen) - 24 == 4 and loop.num_updates == 2  # acted on at the update's first agreement, 1.5 s later
    assert all(torch.equal(weights[k], v) for k, v in loop.model.named_parameters())
    assert set(record.log) == {'all_reduce'} and set(record.devices) == {loop.device}


def _classifier_batches(n):
    torch.manual_seed(0)
    return [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(n)]


@pytest.mark.parametrize('batches', [2, 6])
def test_image_evaluation_syncs_once_not_per_batch(batches, one_rank_group, record):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    loader = _classifier_batches(batches)
    metrics = validate(model, loader, distributed=True, log_interval=1)
    assert record.calls['all_reduce'] == 1 and record.devices == [torch.device('cpu')]
    assert sum(record.calls[s] for s in HOST_SYNCS) == 1, record.calls
    logits, targets = torch.cat([model(x) for x, _ in loader]), torch.cat([t for _, t in loader])
    assert metrics['samples'] == 5 * batches
    assert metrics['loss'] == pytest.approx(nn.functional.cross_entropy(logits, targets).item(), rel=1e-6)
    assert metrics['top1'] == pytest.approx(100. * (logits.argmax(1) == targets).double().mean().item())


def test_the_stop_signal_is_read_without_a_collective(monkeypatch):
    """SIGTERM only sets the flag stop_signals() gives (no collective: the loop agrees on it across ranks); the
    previous handler is back after the first signal, and after the block."""
    monkeypatch.setattr(dist, 'all_reduce', lambda *a, **k: pytest.fail('stop_signal() is local'))
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals() as stop_signal:
        assert stop_signal() == 0 and signal.getsignal(signal.SIGTERM) is not before
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop_signal() == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is before  # a second signal acts at once
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_process_group_has_gloo_beside_nccl_on_cuda():
    """On CUDA the group is 'cpu:gloo,cuda:nccl' (tensors on the GPU through NCCL, object collectives and any CPU
    tensor through gloo); a given --dist-backend is kept when valid, one line otherwise."""
    assert process_group_backend('cuda') == 'cpu:gloo,cuda:nccl'
    assert process_group_backend('cpu') is None  # timm's choice: gloo
    for given in ('nccl', 'gloo', 'cpu:gloo,cuda:nccl'):
        assert process_group_backend('cuda', given) == given
    for bad in ('banana', 'cpu:gloo,nccl', 'banana:gloo', 'cpu:banana', ''):
        with pytest.raises(UsageError, match=f"^--dist-backend '{bad}' is not a torch.distributed backend"):
            process_group_backend('cuda', bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device (NCCL)')
def test_every_collective_of_the_loop_and_evaluation_is_valid_under_nccl_alone():
    """NCCL alone refuses CPU tensors: an update under DDP and an evaluation run in a one-GPU NCCL group."""
    dist.init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device('cuda:0'))
    try:
        device = torch.device('cuda:0')
        model = nn.Linear(4, 1).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
        loop = StepLoop(model, ddp, UpdateStep(torch.optim.SGD(model.parameters(), lr=0.1), model.parameters),
                        distributed=True, stop_signal=lambda: 0)
        x = torch.randn(8, 4, device=device)
        loop.update(lambda: nn.functional.mse_loss(ddp(x), x[:, :1]), 3, stopped_at='', loss_at=str)
        loader = [(torch.randn(5, 4, device=device), torch.randint(0, 3, (5,), device=device))]
        validate(nn.Linear(4, 3).to(device), loader, distributed=True, log_interval=0)
        assert loop.num_updates == 1
    finally:
        dist.destroy_process_group()


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
