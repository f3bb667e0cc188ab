""" The optimizer updates of the image trainer (mlp_vision/train.py: train_one_epoch, in timm's shape): their
result, their NaN and signal stops, and where they wait (host syncs and collectives counted per update and per
evaluation, in a real one-process gloo group); and the shared backbone loader (mlp_vision/weights.py:
load_backbone, used by image fine-tuning, text from_pretrained and the text classifier's --init-from). Small
models, CPU, a few seconds. """
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
from mlp_vision.errors import Interrupted, UsageError
from mlp_vision.image_model import process_group_backend, validate
from mlp_vision.run_files import NonFiniteLossError, stop_signals
from mlp_vision.weights import load_backbone

mse = nn.functional.mse_loss


def _epoch(model, loader, updates=None, optimizer=None, loss_fn=mse, epoch=0, **kwargs):
    """(the metrics of one :func:`train_one_epoch` of ``model`` by SGD, the update state)."""
    updates = updates if updates is not None else image_train.update_state()
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = image_train.train_one_epoch(epoch, model, loader, optimizer, loss_fn, updates, total_epochs=epoch + 1,
                                          log_interval=1000, **kwargs)
    return metrics, updates


class _Endless:
    """A loader of ``length`` batches (``(x, y)`` again and again), none made before it is asked for."""

    def __init__(self, x, y, length):
        self.x, self.y, self.length = x, y, length

    def __len__(self):
        return self.length

    def __iter__(self):
        while True:
            yield self.x, self.y


def _regression():
    torch.manual_seed(0)
    return nn.Linear(4, 1), torch.randn(8, 4), torch.randn(8, 1)


def _unchanged(model, before):
    return all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_accumulated_micro_batches_give_the_update_of_one_big_batch():
    model, x, y = _regression()
    big, model_before = copy.deepcopy(model), copy.deepcopy(model)
    metrics, updates = _epoch(model, list(zip(x.chunk(4), y.chunk(4))), grad_accum_steps=4)
    assert updates['num_updates'] == 1  # four batches, one update
    assert metrics['loss'] == pytest.approx(sum(mse(model_before(xb), yb).item()
                                                for xb, yb in zip(x.chunk(4), y.chunk(4))) / 4)
    _epoch(big, [(x, y)])
    for a, b in zip(model.parameters(), big.parameters()):
        torch.testing.assert_close(a, b)


def test_a_non_finite_loss_stops_before_the_update_with_one_line():
    model, x, y = _regression()
    before = copy.deepcopy(model.state_dict())
    losses = iter([mse(model(x), y), torch.tensor(float('nan'), requires_grad=True)])
    updates = image_train.update_state()
    with pytest.raises(NonFiniteLossError) as e:
        _epoch(model, [(x, y)] * 2, updates, loss_fn=lambda out, target: next(losses), grad_accum_steps=2)
    assert str(e.value) == ('training loss is nan at epoch 0, batch 1 (optimizer update 0); stopped before applying '
                            'it')
    assert _unchanged(model, before) and updates['num_updates'] == 0


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
    result, _ = _epoch(model, [(x, y)] * 6, grad_accum_steps=2, model_ema=Recorder(), lr_scheduler=Recorder())
    assert calls == [('ema', 1), ('sched', 1), ('ema', 2), ('sched', 2), ('ema', 3), ('sched', 3)]
    assert all(isinstance(m, float) for m in metrics)  # the scheduler gets the value, not a function
    assert metrics[-1] == pytest.approx(result['loss'])  # the running training loss


def test_a_stop_signal_raises_before_any_micro_batch():
    model, x, y = _regression()
    with pytest.raises(Interrupted, match='interrupted by SIGINT at epoch 7, batch 0'):
        _epoch(model, [(x, y)], image_train.update_state(stop_signal=lambda: 2), epoch=7,
               loss_fn=lambda *a: pytest.fail('no micro-batch after a stop signal'))


def test_a_stop_signal_inside_a_long_update_abandons_it():
    """One process reads its flag before every micro-batch: a signal at micro-batch 3 of 1,000,000 stops there (issue
    33: --grad-accum-steps 1e9 ignored SIGTERM for 26 minutes), the weights stay as before the update, the update's
    gradients are dropped."""
    model, x, y = _regression()
    before = copy.deepcopy(model.state_dict())
    calls, flag = [], [0]

    def loss_fn(out, target):
        calls.append(1)
        if len(calls) == 3:
            flag[0] = 15  # SIGTERM arrives during micro-batch 2
        return mse(out, target)

    updates = image_train.update_state(stop_signal=lambda: flag[0])
    with pytest.raises(Interrupted, match='interrupted by SIGTERM at epoch 4, batch 0'):
        _epoch(model, _Endless(x, y, 1_000_000), updates, epoch=4, loss_fn=loss_fn, grad_accum_steps=1_000_000)
    assert len(calls) == 3 and updates['num_updates'] == 0
    assert _unchanged(model, before)
    assert all(p.grad is None for p in model.parameters())


def test_a_stop_signal_during_the_last_micro_batch_lets_the_update_finish_and_stops_the_next():
    model, x, y = _regression()
    before = copy.deepcopy(model.state_dict())
    calls, flag = [], [0]

    def loss_fn(out, target):
        calls.append(1)
        if len(calls) == 2:
            flag[0] = 2
        return mse(out, target)

    # the flag, read before each micro-batch, is seen at the update's agreement (before the last backward pass)
    updates = image_train.update_state(stop_signal=lambda: flag[0])
    with pytest.raises(Interrupted, match='interrupted by SIGINT at epoch 0, batch 2'):
        _epoch(model, [(x, y)] * 4, updates, loss_fn=loss_fn, grad_accum_steps=2)
    assert updates['num_updates'] == 1 and updates['stop_pending'] == 2
    assert not _unchanged(model, before)
    assert len(calls) == 2


def test_a_non_finite_loss_names_its_micro_batch_and_drops_the_update():
    model, x, y = _regression()
    before = copy.deepcopy(model.state_dict())
    losses = iter([torch.tensor(float('inf'), requires_grad=True)] + [mse(model(x), y)] * 2)
    updates = image_train.update_state()
    with pytest.raises(NonFiniteLossError,
                       match=r'^training loss is inf at epoch 0, batch 0 \(optimizer update 0\)'):
        _epoch(model, [(x, y)] * 3, updates, loss_fn=lambda out, target: next(losses), grad_accum_steps=3)
    assert _unchanged(model, before) and updates['num_updates'] == 0
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


def _ddp(**kwargs):
    """(DDP of a model with a buffer -- DDP broadcasts it --, its optimizer, the run's update state)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    updates = image_train.update_state(distributed=True, device=torch.device('cpu'), **kwargs)
    return ddp, torch.optim.SGD(model.parameters(), lr=0.1), updates


def _random_batches(n, generator):
    return [(x, x[:, :1]) for x in (torch.randn(8, 4, generator=generator) for _ in range(n))]


def _ddp_epoch(ddp, optimizer, updates, loader, **kwargs):
    return image_train.train_one_epoch(0, ddp, loader, optimizer, mse, updates, total_epochs=1, clip_grad=1.,
                                       log_interval=1000, **kwargs)


@pytest.mark.parametrize('micro_batches', [2, 8])
def test_ddp_updates_sync_once_per_update_not_per_micro_batch(micro_batches, one_rank_group, record):
    """Under DDP: one collective per update (the agreement; DDP's own gradient reduction is not a torch.distributed
    call) and one for the epoch's loss, their tensors on the training device, and the same host syncs per update
    whatever the number of micro-batches."""
    ddp, optimizer, updates = _ddp(agree_every_s=60.)
    data = torch.Generator().manual_seed(1)
    _ddp_epoch(ddp, optimizer, updates, _random_batches(micro_batches, data), grad_accum_steps=micro_batches)
    record.calls.clear(), record.devices.clear()  # the first update also measures the time
    _ddp_epoch(ddp, optimizer, updates, _random_batches(3 * micro_batches, data), grad_accum_steps=micro_batches)
    assert record.calls['all_reduce'] == 3 + 1 and sum(record.calls[c] for c in COLLECTIVES) == 3 + 1
    assert record.devices == [updates['device']] * (3 + 1)
    assert record.calls['tolist'] == 3 + 1 and sum(record.calls[s] for s in HOST_SYNCS) == 3 + 1, record.calls


@pytest.mark.parametrize('batches', [8, 16])
def test_an_image_epoch_syncs_once_per_update(batches, one_rank_group, record):
    """The image epoch adds one all-reduce and one host sync per epoch (its loss over the ranks) to the one per
    update; its loss is the sample-weighted mean of its batches' losses."""
    ddp, optimizer, updates = _ddp(agree_every_s=60.)
    torch.manual_seed(2)
    loader = [(x, x[:, :1]) for x in (torch.randn(8 if i % 2 else 3, 4) for i in range(batches))]
    image_train.train_one_epoch(0, ddp, loader, optimizer, mse, updates, total_epochs=2, grad_accum_steps=4)
    record.calls.clear(), record.devices.clear()
    optimizer.param_groups[0]['lr'] = 0.  # fixed weights: the reference losses below are the same
    metrics = image_train.train_one_epoch(1, ddp, loader, optimizer, mse, updates, total_epochs=2,
                                          grad_accum_steps=4, log_interval=1)
    n_updates = batches // 4
    assert updates['num_updates'] == 2 * n_updates
    assert record.calls['all_reduce'] == n_updates + 1 and set(record.devices) == {updates['device']}
    assert sum(record.calls[s] for s in HOST_SYNCS) == n_updates + 1, record.calls
    with torch.no_grad():  # train mode, as in the epoch: BatchNorm normalises by each batch's own statistics
        ref = [(len(x), mse(ddp(x), y).item()) for x, y in loader]
    assert metrics['loss'] == pytest.approx(sum(n * l for n, l in ref) / sum(n for n, _ in ref), rel=1e-6)


def test_long_updates_agree_every_few_seconds_and_a_stop_abandons_them_on_every_rank(one_rank_group, record,
                                                                                    monkeypatch):
    """The agreements inside a long update are spaced by the agreed time of a micro-batch (a fake clock: 0.5 s
    each, agree every 2 s -> every 4 micro-batches), so every rank calls them at the same micro-batches; a stop
    signal is acted on at the next one, within ~2 s, and abandons the update."""
    clock = [0.]
    monkeypatch.setattr(image_train, 'time', types.SimpleNamespace(perf_counter=lambda: clock[0]))
    seen, flag = [], [0]
    ddp, optimizer, updates = _ddp(agree_every_s=2., stop_signal=lambda: flag[0])
    data = torch.Generator().manual_seed(1)

    def timed_loss(out, target):
        clock[0] += 0.5
        seen.append(1)
        if len(seen) == 25:  # the signal arrives during the third update's second micro-batch
            flag[0] = 15
        return mse(out, target)

    def agreed_at():  # micro-batches done at each agreement
        at = []
        monkeypatch.setattr(image_train, '_agree', lambda *a, _real=image_train._agree: (at.append(len(seen)),
                                                                                         _real(*a))[1])
        return at

    def epoch(loader, accum):
        return image_train.train_one_epoch(0, ddp, loader, optimizer, timed_loss, updates, total_epochs=1,
                                           grad_accum_steps=accum, log_interval=1000)

    at = agreed_at()
    epoch(_random_batches(12, data), 12)
    assert at == [1, 2, 6, 10, 12]  # 1 and 2: the time of a micro-batch is not known yet
    at = agreed_at()
    epoch(_random_batches(12, data), 12)
    assert [a - 12 for a in at] == [4, 8, 12]
    weights = copy.deepcopy(dict(ddp.module.named_parameters()))  # (BatchNorm's statistics move in any forward)
    x = torch.randn(8, 4, generator=data)
    with pytest.raises(Interrupted, match='interrupted by SIGTERM at epoch 0, batch 0'):
        epoch(_Endless(x, x[:, :1], 1_000_000), 1_000_000)
    assert len(seen) - 24 == 4 and updates['num_updates'] == 2  # acted on at the update's first agreement, 1.5 s on
    assert all(torch.equal(weights[k], v) for k, v in ddp.module.named_parameters())
    assert set(record.log) == {'all_reduce'} and set(record.devices) == {updates['device']}


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
        x = torch.randn(8, 4, device=device)
        updates = image_train.update_state(stop_signal=lambda: 0, distributed=True, device=device)
        image_train.train_one_epoch(0, ddp, [(x, x[:, :1])] * 3, torch.optim.SGD(model.parameters(), lr=0.1), mse,
                                    updates, total_epochs=1, grad_accum_steps=3)
        loader = [(torch.randn(5, 4, device=device), torch.randint(0, 3, (5,), device=device))]
        validate(nn.Linear(4, 3).to(device), loader, distributed=True, log_interval=0)
        assert updates['num_updates'] == 1
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
