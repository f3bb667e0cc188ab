""" Image classification in epochs (timm's train.py): the task :class:`ImageClassification` that
:func:`~mlp_vision.training.run.driver.drive` runs for :mod:`mlp_vision.train`, and the training epoch and
evaluation loops (validate.py's evaluation too). Imports no command: validate.py imports this module.
"""
import copy
import logging
import time
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import timm
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.models import model_parameters, save_for_hf
from timm.optim import create_optimizer_v2, optimizer_kwargs
from timm.scheduler import scheduler_kwargs
from timm.utils import ModelEmaV3, distribute_bn, random_seed, unwrap_model

from mlp_vision.errors import UsageError
from mlp_vision.training.data import (
    check_num_classes, create_eval_loader, create_train_loader, create_train_val_datasets, dataset_class_names,
    dataset_source, fit_batch_to_data, prepare_digits_folder, train_samples_per_rank)
from mlp_vision.training.run.checkpoint import (
    atomic_folder, is_training_checkpoint, load_checkpoint_file, load_model_weights, preserve_rng)
from mlp_vision.training.run.driver import Optimization, TrainingTask
from mlp_vision.training.run.loop import StepLoop, format_duration, progress_line, warn_global_batch_beyond_data
from mlp_vision.training.run.summary import plot_curves
from mlp_vision.training.run.training_run import UpdateStep, create_lr_scheduler, setup_amp
from mlp_vision.training.tasks.image_model import (
    check_activations, create_model, load_pretrained_weights, model_create_kwargs, resolve_model_data_config)

__all__ = ['train_one_epoch', 'evaluate', 'reports_top5', 'ImageClassification', 'EpochMetrics',
           'resolve_lr', 'uses_mixup', 'DEMO_RECIPE', 'OWN_FOLDER_RECIPE', 'SMALL_DATA_IMAGES', 'DEFAULT_EPOCHS']

_logger = logging.getLogger(__name__)
_task_logger = logging.getLogger('train')  # the command's: the task's lines are the command's log

DEMO_RECIPE = 'demo_digits'  # configs/demo_digits.yaml, the recipe of the run with no dataset
OWN_FOLDER_RECIPE = 'own_folder_cpu'  # configs/own_folder_cpu.yaml, a user's small photo folder on a CPU
SMALL_DATA_IMAGES = 20_000  # a training set up to this size, given without -c, gets the hint to use that recipe
DEFAULT_EPOCHS = 300  # train.py's --epochs default, timm's ImageNet schedule (the small-data hint compares to it)


def train_one_epoch(epoch: int, loop: StepLoop, loader, loss_fn: Callable, *, total_epochs: int, amp_autocast=suppress,
                    mixup_fn=None, grad_accum_steps: int = 1, channels_last: bool = False, world_size: int = 1,
                    log_interval: int = 50, primary: bool = True) -> Dict[str, float]:
    """One epoch with the run's ``loop``; returns {'loss', 'lr', 'img_per_sec', 'seconds'} (loss and rate over every
    rank). Each optimizer update is :meth:`~mlp_vision.training.run.loop.StepLoop.update` over ``grad_accum_steps``
    batches (the last one over the batches left), which owns DDP sync, the NaN / inf and signal stops and the one host
    sync per update; the epoch's loss is all-reduced once, at its end.
    """
    model, optimizer = loop.train_model, loop.update_step.optimizer
    model.train()
    num_batches = len(loader)
    updates_per_epoch = (num_batches + grad_accum_steps - 1) // grad_accum_steps
    batches = iter(loader)

    def micro_loss():
        input, target = next(batches)
        if mixup_fn is not None:
            input, target = mixup_fn(input, target)
        if channels_last:
            input = input.contiguous(memory_format=torch.channels_last)
        with amp_autocast():
            return loss_fn(model(input), target), input.shape[0]  # weighted by its samples

    loss_sum, sample_count = 0., 0
    window_loss, window_samples = 0., 0
    epoch_start = time.perf_counter()
    optimizer.zero_grad()
    for update_idx in range(updates_per_epoch):
        first = update_idx * grad_accum_steps  # the update's first batch; the last update may have fewer
        losses = loop.update(
            micro_loss, min(grad_accum_steps, num_batches - first), stopped_at=f'epoch {epoch}, batch {first}',
            loss_at=lambda m: f'epoch {epoch}, batch {first + m} (optimizer update {loop.num_updates})',
            metric=lambda u: (loss_sum + u.loss_sum) / (sample_count + u.weight_sum))
        loss_sum, sample_count = loss_sum + losses.loss_sum, sample_count + losses.weight_sum
        window_loss, window_samples = window_loss + losses.loss_sum, window_samples + losses.weight_sum

        now = time.perf_counter()
        if update_idx == 0:  # the first update includes loader start-up: the rate counts from its end
            first_done = now
        last = update_idx == updates_per_epoch - 1
        if primary and (last or (update_idx + 1) % log_interval == 0):
            sec_per_update = (now - first_done) / update_idx if update_idx else now - epoch_start
            img_per_sec = losses.weight_sum * world_size / sec_per_update if sec_per_update > 0 else 0.
            left_epoch = (updates_per_epoch - update_idx - 1) * sec_per_update
            left_run = left_epoch + (total_epochs - epoch - 1) * updates_per_epoch * sec_per_update
            _logger.info(progress_line(
                f'Train: {epoch}/{total_epochs - 1} [{update_idx + 1:>{len(str(updates_per_epoch))}d}/'
                f'{updates_per_epoch} ({100. * (update_idx + 1) / updates_per_epoch:3.0f}%)]',
                f'{window_loss / max(window_samples, 1):.4f} ({loss_sum / sample_count:.4f})',
                optimizer.param_groups[0]['lr'], f'{img_per_sec:,.0f} img/s',
                f'epoch {format_duration(left_epoch)}, training {format_duration(left_run)}'))
            window_loss, window_samples = 0., 0

    seconds = time.perf_counter() - epoch_start
    totals = torch.tensor([loss_sum, float(sample_count)], dtype=torch.float64, device=loop.device)
    if loop.distributed:
        dist.all_reduce(totals)
    total_loss, total_samples = totals.tolist()
    lr = sum(g['lr'] for g in optimizer.param_groups) / len(optimizer.param_groups)
    return {'loss': total_loss / total_samples, 'lr': lr, 'img_per_sec': total_samples / seconds, 'seconds': seconds}


def reports_top5(num_classes: int) -> bool:
    """Whether top-5 accuracy means anything: with 5 classes or fewer it is 100 % whatever the model does (then an
    empty ``eval_top5`` cell, a null ``top5``, and ``--eval-metric top5`` refused)."""
    return num_classes > 5


@torch.no_grad()
def evaluate(model: nn.Module, loader, *, amp_autocast=suppress, channels_last: bool = False, distributed: bool = False,
             log_interval: int = 50, primary: bool = True) -> Dict[str, float]:
    """Top-1 / top-5 accuracy (%; ``top5`` None per :func:`reports_top5`), mean cross-entropy and images/s over the
    loader. Distributed: each rank evaluates its own samples (the ``StridedSampler`` pads nothing) and the sums,
    kept on the device, are all-reduced once, so the numbers equal a one-process run.
    """
    model.eval()
    num_batches = len(loader)
    sums = None
    processed = 0
    start = time.perf_counter()
    for batch_idx, (input, target) in enumerate(loader):
        if channels_last:
            input = input.contiguous(memory_format=torch.channels_last)
        with amp_autocast():
            output = model(input)
        if isinstance(output, (tuple, list)):
            output = output[0]
        output = output.float()
        processed += len(target)
        loss = F.cross_entropy(output, target, reduction='sum')
        num_classes = output.shape[1]
        correct = output.topk(min(5, num_classes), dim=1).indices.eq(target[:, None])
        batch = torch.stack([loss.double(), correct[:, :1].sum().double(), correct.sum().double()])
        sums = batch if sums is None else sums + batch  # on the device: no host sync per batch
        if primary and log_interval and ((batch_idx + 1) % log_interval == 0 or batch_idx == num_batches - 1):
            elapsed = time.perf_counter() - start
            _logger.info(f'Test: [{batch_idx + 1:>{len(str(num_batches))}d}/{num_batches}]  '
                         f'{processed / max(elapsed, 1e-9):,.0f} img/s')
    if sums is None:
        raise RuntimeError('evaluation loader yielded no batches')
    sums = torch.cat([sums, sums.new_tensor([processed])])
    if distributed:
        dist.all_reduce(sums)
    seconds = time.perf_counter() - start
    loss_sum, c1, c5, n = sums.tolist()  # the evaluation's one host sync
    return {'loss': loss_sum / n, 'top1': 100. * c1 / n, 'top5': 100. * c5 / n if reports_top5(num_classes) else None,
            'samples': int(n), 'img_per_sec': n / seconds, 'seconds': seconds}


def resolve_lr(args, world_size: int) -> None:
    """timm's rule: with no --lr, --lr-base scaled from --lr-base-size to the global batch (derived: args.yaml keeps
    --lr unset, so a resume with another batch scales again)."""
    if args.lr is not None:
        return
    global_batch = _global_batch(args, world_size)
    ratio = global_batch / args.lr_base_size
    scale = args.lr_base_scale or ('sqrt' if any(o in args.opt.lower() for o in ('ada', 'lamb')) else 'linear')
    if scale == 'sqrt':
        ratio = ratio ** 0.5
    args.derive(lr=args.lr_base * ratio, **({} if args.lr_base_scale else {'lr_base_scale': scale}))
    _task_logger.info(f'learning rate {args.lr:.4g} = lr_base {args.lr_base:g} x {args.lr_base_scale} scaling of '
                      f'the global batch {global_batch} / {args.lr_base_size}')


@dataclass
class EpochMetrics:
    """The latest epoch's metrics (None before the first epoch / without evaluation)."""
    train: Optional[dict] = None
    eval: Optional[dict] = None
    ema_eval: Optional[dict] = None
    peak_mem_gib: Optional[float] = None  # max over this process's epochs (CUDA)


class ImageClassification(TrainingTask):
    """Image classification in epochs for :func:`~mlp_vision.training.run.driver.drive`.

    ``validate_demo(run, task)``: the demo's closing validation of its best checkpoint (every rank, before
    ``pretrained/``), kept as ``demo_validation`` in ``results.json``; given by train.py, since validate.py imports
    this module; None: no validation."""
    logger = _task_logger
    stop_advice = 'Lower --lr, add --clip-grad or more --warmup-epochs'

    def __init__(self, args, run, demo: bool, command: str,
                 validate_demo: Optional[Callable[[Any, 'ImageClassification'], Dict[str, Any]]] = None):
        super().__init__(args, run, command)
        self.demo, self.validate_demo = demo, validate_demo
        if run.dist_info.distributed:
            _task_logger.info(f'distributed: {run.dist_info.world_size} processes, backend '
                              f'{torch.distributed.get_backend()}, device {run.dist_info.device} on rank 0')
        if demo:
            args.derive(data_dir=str(prepare_digits_folder()), dataset='', train_split='train', val_split='val')
            _task_logger.info(
                'Demo: no dataset was given, so this trains a small model on scikit-learn\'s bundled handwritten '
                f'digits (1,797 real 8x8 scans, 10 classes), written once as an ImageFolder tree under '
                f'{args.data_dir}, through the same pipeline as an ImageNet run (recipe {DEMO_RECIPE}). '
                f'For your own photos: -c {OWN_FOLDER_RECIPE} --data-dir DIR (README, "Your own photos").')
        self.data_dir = args.data_dir or args.data
        self.metrics = EpochMetrics()

    def resume_identity(self) -> dict:
        return {'arch': self.args.model}

    def setup(self) -> Optimization:
        """Datasets, model, optimizer, loaders, loss and schedule, from the flags."""
        args, dist_info = self.args, self.run.dist_info
        random_seed(args.seed, dist_info.rank)
        self.dataset_train, self.dataset_eval, self.train_classes = _create_datasets(args, self.data_dir)
        _fit_batch_to_training_set(args, self.dataset_train, dist_info.world_size)
        model, self.create_kwargs, self.data_config = _create_model(args, dist_info)
        resolve_lr(args, dist_info.world_size)
        # timm's optimizer_kwargs reads extra arguments from `opt_args`; this script's flag is --opt-kwargs
        opt_kwargs = {**optimizer_kwargs(cfg=args), **args.opt_kwargs}
        try:
            optimizer = create_optimizer_v2(model, **opt_kwargs)
        except (TypeError, ValueError) as e:
            raise UsageError(f'--opt {args.opt} cannot be built with {args.opt_kwargs or "these settings"}: {e}') from e
        amp_autocast, loss_scaler, amp_dtype = setup_amp(args.amp, args.amp_dtype, dist_info.device)
        update_step = UpdateStep(optimizer, lambda: model_parameters(self.opt.train_model,
                                                                     exclude_head='agc' in args.clip_mode),
                                 loss_scaler, args.clip_grad, args.clip_mode)
        self.loader_train, self.sampler_train, self.loader_eval = _create_loaders(
            args, self.dataset_train, self.dataset_eval, self.data_config, dist_info)
        self.mixup_fn, self.train_loss_fn = _create_mixup_and_loss(args, dist_info.device)
        self.updates_per_epoch = (len(self.loader_train) + args.grad_accum_steps - 1) // args.grad_accum_steps
        warn_global_batch_beyond_data(args.batch_size, dist_info.world_size, args.grad_accum_steps,
                                      len(self.dataset_train), 'images')
        schedule = dict(scheduler_kwargs(args, decreasing_metric=args.eval_metric == 'loss'), lr=args.lr)
        lr_scheduler, num_epochs = create_lr_scheduler(optimizer, schedule, self.updates_per_epoch)
        return Optimization(model, optimizer, lr_scheduler, schedule, loss_scaler, update_step, amp_autocast,
                            amp_dtype, total=num_epochs, total_flag='--epochs', weights_only=args.no_resume_opt)

    def create_ema(self, model: nn.Module) -> Optional[ModelEmaV3]:
        args = self.args
        if not args.model_ema:
            return None
        return ModelEmaV3(model, decay=args.model_ema_decay, use_warmup=args.model_ema_warmup,
                          device=torch.device('cpu') if args.model_ema_force_cpu else None)

    def output_folder(self) -> Tuple[str, str]:
        args = self.args
        return './output/train', '-'.join([datetime.now().strftime('%Y%m%d-%H%M%S')]
                                          + (['demo_digits'] if self.demo else [])
                                          + [args.model.replace('/', '_'), str(self.data_config['input_size'][-1])])

    def log_setup(self) -> None:
        args, dist_info, opt = self.args, self.run.dist_info, self.opt
        num_params = sum(p.numel() for p in opt.train_model.parameters())
        _task_logger.info(
            f'Model {args.model} ({num_params / 1e6:.3f} M params, {self.create_kwargs}) on {dist_info.device}'
            f'{f" x {dist_info.world_size} processes" if dist_info.distributed else ""}; '
            f'input {self.data_config["input_size"]}, AMP {opt.amp_dtype if args.amp else "off"}')
        dataset_eval = self.dataset_eval
        # what was read (a folder or tar found for the split), not the split name asked for
        val_source = (dataset_source(dataset_eval) or args.val_split) if dataset_eval is not None else 'none'
        _task_logger.info(
            f'Data {self.data_dir or args.dataset}: {len(self.dataset_train)} training images '
            f'({dataset_source(self.dataset_train) or args.train_split}), '
            f'{len(dataset_eval) if dataset_eval is not None else 0} validation images ({val_source}), '
            f'{args.num_classes} classes')
        if not self.demo:
            _hint_small_data_recipe(args, len(self.dataset_train))
        # an epoch may sample less than the training set (the loader's warning says why)
        samples, images = len(self.loader_train) * args.batch_size * dist_info.world_size, len(self.dataset_train)
        _task_logger.info(
            f'Training {opt.total} epochs x {self.updates_per_epoch} updates, global batch '
            f'{_global_batch(args, dist_info.world_size)}, {args.opt} lr {args.lr:.4g}, {args.sched} schedule'
            + (f'; an epoch trains {samples:,} samples of the {images:,} images' if samples < images else '')
            + (f'; resuming at epoch {opt.start} from {args.resume}' if args.resume else ''))

    def train(self) -> bool:
        """Train from ``opt.start`` to the end: per epoch train, evaluate, step the schedule, save, log."""
        args, run, opt, metrics = self.args, self.run, self.opt, self.metrics
        self.train_start = time.time()
        dist_info, device = run.dist_info, run.dist_info.device
        # one loop for the run: a stop agreed at an epoch's last update stops the next epoch's first
        loop = StepLoop(opt.train_model, opt.train_model, opt.update_step, opt.scheduler, opt.model_ema,
                        run.stop_signal, dist_info.distributed, opt.num_updates, device=device)
        for epoch in range(opt.start, opt.total):
            if self.sampler_train is not None:
                self.sampler_train.set_epoch(epoch)
            if self.mixup_fn is not None and args.mixup_off_epoch and epoch >= args.mixup_off_epoch:
                self.mixup_fn.mixup_enabled = False
            if device.type == 'cuda':
                torch.cuda.reset_peak_memory_stats(device)  # peak_mem_gib is this epoch's (training + eval)
            metrics.train = train_one_epoch(
                epoch, loop, self.loader_train, self.train_loss_fn, total_epochs=opt.total,
                amp_autocast=opt.amp_autocast, mixup_fn=self.mixup_fn, grad_accum_steps=args.grad_accum_steps,
                channels_last=args.channels_last, world_size=dist_info.world_size, log_interval=args.log_interval,
                primary=dist_info.primary)
            opt.num_updates = loop.num_updates
            if dist_info.distributed and args.dist_bn in ('broadcast', 'reduce'):
                distribute_bn(opt.train_model, dist_info.world_size, args.dist_bn == 'reduce')
            with preserve_rng():  # evaluation must not shift the training's random stream
                metric = _evaluate_epoch(args, dist_info, self, metrics)
            opt.scheduler.step(epoch + 1, metric)  # before saving: the checkpoint holds next epoch's LR
            row = _summary_row(epoch, metrics, device)
            if dist_info.primary:
                run.summary.append(row)
            written = run.save(
                epoch, metric, model=opt.train_model, optimizer=opt.optimizer, scheduler=opt.scheduler,
                schedule=opt.schedule, num_updates=opt.num_updates, loss_scaler=opt.loss_scaler,
                model_cfg={'name': args.model, 'kwargs': self.create_kwargs}, data_cfg=dict(self.data_config),
                class_names=self.train_classes,  # label order; validate.py labels class folders by these names
                state_dict_ema=opt.model_ema.module.state_dict() if opt.model_ema is not None else None,
                eval_metrics=metrics.eval, ema_eval_metrics=metrics.ema_eval)
            if dist_info.primary:
                _task_logger.info(_epoch_message(epoch, opt.total, metrics, row, written['best']))
        return True

    def final_results(self, digests) -> Optional[dict]:
        """The demo's validation (every rank), ``pretrained/`` and the results (rank 0; None elsewhere)."""
        args, run, opt, metrics = self.args, self.run, self.opt, self.metrics
        dist_info, device = run.dist_info, run.dist_info.device
        validates = self.demo and self.loader_eval is not None and self.validate_demo is not None
        demo_val = self.validate_demo(run, self) if validates else None
        if not dist_info.primary:
            return None
        loader_train, loader_eval = self.loader_train, self.loader_eval
        pretrained = _export_pretrained(run, self)
        return {
            'model': args.model, 'model_kwargs': self.create_kwargs, 'experiment_dir': str(run.output_dir),
            'device': str(device), 'device_name': torch.cuda.get_device_name(device) if device.type == 'cuda' else None,
            'cuda_peak_mem_gib': metrics.peak_mem_gib,  # max over this process's epochs of max_memory_allocated
            'torch_version': torch.__version__, 'world_size': dist_info.world_size, 'epochs': opt.total,
            'global_batch': _global_batch(args, dist_info.world_size), 'lr': args.lr, 'final_epoch': opt.total - 1,
            'train': metrics.train, 'eval': metrics.eval, 'ema_eval': metrics.ema_eval,
            'best': run.saver.best, 'eval_metric': args.eval_metric, 'checkpoints': run.checkpoint_files(),
            'pretrained': str(pretrained), 'weights_sha256_per_rank': digests, 'ranks_agree': len(set(digests)) == 1,
            'train_seconds_this_process': time.time() - self.train_start, 'demo_validation': demo_val,
            'skipped_images': {  # unreadable files, left out (never replaced): last epoch / last evaluation, this rank
                'train': loader_train.skipped, 'eval': loader_eval.skipped if loader_eval is not None else 0,
                'files': {**loader_train.skipped_files,
                          **(loader_eval.skipped_files if loader_eval is not None else {})}},
            'command': self.command,
        }

    def close(self) -> None:
        # end the loaders' persistent workers with the run: a later garbage collection stalled ~10 s per loader
        self.loader_train = self.loader_eval = None

    def report(self, results: dict) -> None:
        """The curves and the closing log lines."""
        args, run = self.args, self.run
        metrics, best, data_dir, demo_val = self.metrics, results['best'], self.data_dir, results['demo_validation']
        plot_curves(run.output_dir / 'summary.csv', run.output_dir / 'curves.png',
                    title=f'{args.model} on {Path(data_dir).name if data_dir else args.dataset}')
        if metrics.eval is not None:
            msg = (f'Done in {format_duration(time.time() - self.train_start)}: final eval '
                   f'{_accuracy_text(metrics.eval)} loss {metrics.eval["loss"]:.4f}')
            if best:
                msg += f'; best {args.eval_metric} {best["metric"]:.4f} at epoch {best["epoch"]}'
            _task_logger.info(msg)
        if demo_val is not None:
            _task_logger.info(
                f'Demo result: validation accuracy {demo_val["top1"]:.2f}% top-1 on {demo_val["samples"]} held-out '
                f'digit images (chance: 10%), checkpoint {run.saver.best_path}; '
                f'total time {format_duration(time.time() - run.start_time)}.')


def _create_datasets(args, data_dir):
    """(training set, evaluation set or None, the training set's class names); sets --num-classes if unset."""
    dataset_train, dataset_eval = create_train_val_datasets(
        args.dataset, data_dir, train_split=args.train_split, val_split=args.val_split, class_map=args.class_map,
        download=args.dataset_download, input_img_mode=args.input_img_mode, batch_size=args.batch_size,
        seed=args.seed)
    train_classes = dataset_class_names(dataset_train)
    if args.num_classes is None:
        if train_classes is None:
            raise UsageError('the training set does not list its classes: pass --num-classes N')
        args.derive(num_classes=len(train_classes))
    if args.eval_metric == 'top5' and not reports_top5(args.num_classes):
        raise UsageError(f'--eval-metric top5 with {args.num_classes} classes: every label is among the top 5, so it '
                         f'is 100 % whatever the model does; use top1 or loss')
    hint = f' (--num-classes {args.num_classes}); pass --num-classes to match the data, or a --class-map'
    check_num_classes(dataset_train, args.num_classes, 'training set', hint)
    if dataset_eval is not None:
        check_num_classes(dataset_eval, args.num_classes, 'validation set', hint)
    return dataset_train, dataset_eval, train_classes


def _fit_batch_to_training_set(args, dataset_train, world_size: int) -> None:
    """A training set smaller than one batch per process trains in one batch of all of it (with a warning), before
    the lr is scaled to the batch; an iterable dataset keeps --batch-size."""
    if isinstance(dataset_train, torch.utils.data.IterableDataset):
        return
    batch_size = fit_batch_to_data(  # mixing pairs the images of a batch: an even one
        args.batch_size, train_samples_per_rank(dataset_train, world_size, args.aug_repeats), even=uses_mixup(args))
    if batch_size != args.batch_size:
        args.derive(batch_size=batch_size)


def _hint_small_data_recipe(args, num_images: int) -> None:
    """Warn when a small training set gets no -c recipe and the default schedule (timm's ImageNet one: hours on a
    CPU for a few hundred photos), naming the shipped recipe made for it; the run goes on as asked."""
    if args.config or args.resume or num_images > SMALL_DATA_IMAGES or args.epochs != DEFAULT_EPOCHS:
        return
    _task_logger.warning(
        f'no -c recipe: {num_images:,} training images get timm\'s ImageNet defaults ({args.epochs} epochs of '
        f'--opt {args.opt}, {args.model} at {args.img_size or "its default size"}{" px" if args.img_size else ""}), '
        f'made for a million images on GPUs: hours on a CPU; for a small folder on a CPU, -c {OWN_FOLDER_RECIPE} '
        f'trains a small model in minutes (configs/{OWN_FOLDER_RECIPE}.yaml)')


def _create_model(args, dist_info):
    """The model on its device with its starting weights; returns (model, create kwargs, data config)."""
    img_size = args.input_size[-2:] if args.input_size else args.img_size
    # models with a fixed input size (ours, ViTs) are built for --img-size; others just get resized inputs
    takes_img_size = timm.is_model(args.model) and timm.models.get_pretrained_cfg_value(args.model, 'fixed_input_size')
    create_kwargs = model_create_kwargs(
        num_classes=args.num_classes, in_chans=args.in_chans or (args.input_size[0] if args.input_size else None),
        img_size=img_size if takes_img_size else None, drop_rate=args.drop, drop_path_rate=args.drop_path,
        global_pool=args.gp, model_kwargs=args.model_kwargs)
    model = create_model(args.model, pretrained=args.pretrained, **create_kwargs)
    if args.pretrained_path:
        weights = load_checkpoint_file(args.pretrained_path, trust=args.trust_checkpoint, what='--pretrained-path')
        load_pretrained_weights(model, args.model, weights, f'--pretrained-path {args.pretrained_path}',
                                allow_missing=args.allow_missing_weights)
    if args.initial_checkpoint:
        ckpt = load_checkpoint_file(args.initial_checkpoint, trust=args.trust_checkpoint, what='--initial-checkpoint')
        state_dict = ckpt['state_dict'] if is_training_checkpoint(ckpt) else ckpt
        load_model_weights(model, state_dict, f'--initial-checkpoint {args.initial_checkpoint}', args.model)

    data_config = resolve_model_data_config(args, model)
    # before the first batch: a -c recipe or a resumed run's settings may give a size no machine holds
    check_activations(args.model, create_kwargs, data_config['input_size'], args.batch_size,
                      training=not args.grad_checkpointing)

    if args.grad_checkpointing:
        model.set_grad_checkpointing(enable=True)
    model.to(device=dist_info.device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    if dist_info.distributed and args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model, create_kwargs, data_config


def _create_loaders(args, dataset_train, dataset_eval, data_config, dist_info):
    """(training loader, its distributed sampler or None, evaluation loader or None)."""
    device = dist_info.device
    loader_train, sampler_train = create_train_loader(
        dataset_train, data_config, args.batch_size, device,
        seed=args.seed, rank=dist_info.rank, world_size=dist_info.world_size, num_workers=args.workers,
        pin_memory=args.pin_mem, aug_repeats=args.aug_repeats, no_aug=args.no_aug, scale=args.scale,
        ratio=args.ratio, hflip=args.hflip, vflip=args.vflip, color_jitter=args.color_jitter,
        auto_augment=args.aa, train_interpolation=args.train_interpolation, re_prob=args.reprob,
        re_mode=args.remode, re_count=args.recount)
    loader_eval = None
    if dataset_eval is not None:
        loader_eval = create_eval_loader(
            dataset_eval, data_config, args.validation_batch_size or args.batch_size, device,
            num_workers=args.workers, distributed=dist_info.distributed, pin_memory=args.pin_mem)
    return loader_train, sampler_train, loader_eval


def _create_mixup_and_loss(args, device):
    """(Mixup / CutMix or None, the training loss that matches its soft or hard targets)."""
    mixup_fn = None
    if uses_mixup(args):
        mixup_fn = Mixup(
            mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, cutmix_minmax=args.cutmix_minmax,
            prob=args.mixup_prob, switch_prob=args.mixup_switch_prob, mode=args.mixup_mode,
            label_smoothing=args.smoothing, num_classes=args.num_classes)
        train_loss_fn = (BinaryCrossEntropy(target_threshold=args.bce_target_thresh) if args.bce_loss
                         else SoftTargetCrossEntropy())
    elif args.smoothing:
        train_loss_fn = (BinaryCrossEntropy(smoothing=args.smoothing, target_threshold=args.bce_target_thresh)
                         if args.bce_loss else LabelSmoothingCrossEntropy(smoothing=args.smoothing))
    else:
        train_loss_fn = nn.BCEWithLogitsLoss() if args.bce_loss else nn.CrossEntropyLoss()
    return mixup_fn, train_loss_fn.to(device=device)


def uses_mixup(args) -> bool:  # mixup or cutmix is on
    return args.mixup > 0 or args.cutmix > 0 or args.cutmix_minmax is not None


def _global_batch(args, world_size: int) -> int:
    return args.batch_size * world_size * args.grad_accum_steps


def _evaluate_epoch(args, dist_info, job: ImageClassification, metrics: EpochMetrics):
    """Evaluate the model (and its EMA) into ``metrics``; returns the metric that selects the best checkpoint."""
    if job.loader_eval is None:
        return None
    evaluate_on = partial(evaluate, loader=job.loader_eval, amp_autocast=job.opt.amp_autocast, log_interval=0,
                          channels_last=args.channels_last, distributed=dist_info.distributed,
                          primary=dist_info.primary)
    metrics.eval = evaluate_on(job.opt.train_model)
    if job.opt.model_ema is None or args.model_ema_force_cpu:
        return metrics.eval[args.eval_metric]
    if dist_info.distributed and args.dist_bn in ('broadcast', 'reduce'):
        distribute_bn(job.opt.model_ema, dist_info.world_size, args.dist_bn == 'reduce')
    metrics.ema_eval = evaluate_on(job.opt.model_ema.module)
    return metrics.ema_eval[args.eval_metric]  # as timm: EMA selects the best checkpoint


def _summary_row(epoch: int, metrics: EpochMetrics, device) -> dict:
    """One summary.csv row; also updates ``metrics.peak_mem_gib`` on CUDA."""
    row = {'epoch': epoch, 'lr': metrics.train['lr'], 'train_loss': metrics.train['loss']}
    if metrics.eval is not None:
        row.update({f'eval_{k}': metrics.eval[k] for k in ('loss', 'top1', 'top5')})
    if metrics.ema_eval is not None:
        row.update({f'ema_eval_{k}': metrics.ema_eval[k] for k in ('loss', 'top1', 'top5')})
    row.update(train_img_per_sec=metrics.train['img_per_sec'], epoch_seconds=metrics.train['seconds'])
    if device.type == 'cuda':
        row['peak_mem_gib'] = torch.cuda.max_memory_allocated(device) / 2 ** 30
        metrics.peak_mem_gib = max(metrics.peak_mem_gib or 0., row['peak_mem_gib'])
    return row


def _accuracy_text(metrics: dict) -> str:
    """``'top1 97.25 top5 99.75'``; top-5 only where it means something (more than 5 classes)."""
    return f'top1 {metrics["top1"]:.2f}' + (f' top5 {metrics["top5"]:.2f}' if metrics['top5'] is not None else '')


def _epoch_message(epoch: int, num_epochs: int, metrics: EpochMetrics, row: dict, saved_best: bool) -> str:
    msg = f'Epoch {epoch}/{num_epochs - 1}: train loss {metrics.train["loss"]:.4f}'
    if metrics.eval is not None:
        msg += f' | eval loss {metrics.eval["loss"]:.4f} {_accuracy_text(metrics.eval)}'
    if metrics.ema_eval is not None:
        msg += f' | EMA top1 {metrics.ema_eval["top1"]:.2f}'
    msg += f' | {metrics.train["img_per_sec"]:,.0f} img/s, {format_duration(metrics.train["seconds"])}'
    if 'peak_mem_gib' in row:
        msg += f', peak {row["peak_mem_gib"]:.2f} GiB'
    return msg + ' | saved last.pth' + (' + model_best.pth' if saved_best else '')


_UPSTREAM_CFG_KEYS = ('tag', 'license', 'description', 'origin_url', 'paper_name', 'paper_ids', 'notes', 'url',
                      'file', 'hf_hub_id', 'hf_hub_filename', 'source')


def _run_description(job: ImageClassification, num_classes: int) -> str:
    """One line for the export's ``pretrained_cfg['description']``: model, data, classes and starting weights."""
    args = job.args
    data = args.dataset or (Path(job.data_dir).resolve().name if job.data_dir else 'unnamed data')
    text = f'{args.model} trained by mlp_vision from {data}, {num_classes} classes'
    if args.initial_checkpoint:
        text += f', starting from {Path(args.initial_checkpoint).name}'
    elif args.pretrained:
        text += f', starting from timm\'s pretrained {args.model}'
    return text


def _export_pretrained(run, job: ImageClassification) -> Path:
    """``pretrained/``: the best weights (the EMA's where its accuracy chose them; the last epoch's when nothing was
    evaluated) written atomically by timm's ``save_for_hf`` (``config.json`` with class names and data config,
    ``model.safetensors``), so ``timm.create_model('local-dir:RUN/pretrained', pretrained=True)`` builds it."""
    source = run.saver.best_path if run.saver.best_path.exists() else run.saver.last_path
    ckpt = load_checkpoint_file(source, what=source.name)
    use_ema = job.opt.model_ema is not None and ckpt.get('state_dict_ema') is not None
    model = copy.deepcopy(unwrap_model(job.opt.train_model)).cpu().to(memory_format=torch.contiguous_format)
    load_model_weights(model, ckpt['state_dict_ema' if use_ema else 'state_dict'], str(source), ckpt.get('arch'))
    data_config = {k: v for k, v in job.data_config.items() if k in ('input_size', 'interpolation', 'mean', 'std',
                                                                      'crop_pct', 'crop_mode')}
    # the architecture's cfg names the upstream weights (tag, license, paper): this export describes the run instead
    model.pretrained_cfg = {k: v for k, v in model.pretrained_cfg.items() if k not in _UPSTREAM_CFG_KEYS}
    model_config = {'pretrained_cfg': {'description': _run_description(job, model.num_classes)}}
    if job.train_classes:
        model_config['label_names'] = list(job.train_classes)
    folder = run.output_dir / 'pretrained'
    with atomic_folder(folder) as tmp:
        save_for_hf(model, tmp, model_config=model_config, safe_serialization=True, data_config=data_config)
    _task_logger.info(f'{folder}: the {"EMA " if use_ema else ""}weights of {source.name} for timm '
                      f"(timm.create_model('local-dir:{folder}', pretrained=True), features_only=True too)")
    return folder

