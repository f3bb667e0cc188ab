""" ``mlp-vision-train`` / ``python -m mlp_vision.train`` / ``python train.py``: timm's ImageNet training pipeline
for the registered models (and any timm model); with no dataset, the demo on scikit-learn's handwritten digits.

Flags follow timm's train.py; ``-c`` reads a yaml file of flag values or a recipe of ``configs/``; explicit flags win.
Usage, outputs and resume: README, "Training and validation". Its parts, by job: :mod:`~mlp_vision.image_data`
(datasets and loaders), :mod:`~mlp_vision.image_model` (model creation, weight loading, ``validate``, device / AMP /
compile) and :mod:`~mlp_vision.run_files` (a run's files and their safety, called in order).
"""
import argparse
import copy
import hashlib
import logging
import signal
import time
from contextlib import nullcontext, suppress
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import timm
import torch
import torch.distributed as dist
import torch.nn as nn
from timm.data import Mixup, create_transform
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.models import model_parameters, save_for_hf
from timm.optim import create_optimizer_v2, list_optimizers, optimizer_kwargs
from timm.scheduler import create_scheduler_v2, scheduler_kwargs
from timm.utils import ModelEmaV3, dispatch_clip_grad, distribute_bn, random_seed, unwrap_model

from mlp_vision.arguments import (
    SEED_MAX, THREADS_RANGE, ArgumentParser, DefaultsHelpFormatter, ParseKwargs, check_flag_ranges, check_kwargs_flags,
    find_recipe, set_run_threads)
from mlp_vision.bounds import BOUND_RANGES, size_bounds
from mlp_vision.errors import Interrupted, RunError, UsageError, run_cli
from mlp_vision.outputs import atomic_folder, setup_logging
from mlp_vision.image_data import (
    INTERPOLATIONS, check_dataset_package, check_image_args, check_num_classes, create_eval_loader,
    create_train_loader, create_train_val_datasets, dataset_class_names, dataset_source, fit_batch_to_data,
    prepare_digits_folder, train_samples_per_rank)
from mlp_vision.weights import ALLOW_MISSING_FLAG, is_training_checkpoint, load_checkpoint_file, load_model_weights
from mlp_vision.run_files import (
    NonFiniteLossError, RunFolder, all_gather_objects, check_not_finished,
    close_run_folder, log_settings_changes, open_run_folder, parse_run_args, preserve_rng, restore_ema,
    restore_rng, restore_training_state, save_checkpoint, stop_error, stop_signals, write_results)
from mlp_vision.image_model import (
    CROP_PCT_RANGE, DistInfo, add_common_arguments, add_compile_arguments, add_dataset_arguments,
    add_device_arguments, add_input_arguments, check_activations, check_compile_backend, compile_model, create_model,
    init_device, load_pretrained_weights, model_create_kwargs, reports_top5, resolve_model_data_config, setup_amp,
    validate)

_logger = logging.getLogger('train')

PROG = 'train.py'  # the command's name in messages (the console script and ``python -m`` pass their own)
DEMO_RECIPE = 'demo_digits'  # configs/demo_digits.yaml, the recipe of the run with no dataset
OWN_FOLDER_RECIPE = 'own_folder_cpu'  # configs/own_folder_cpu.yaml, a user's small photo folder on a CPU
SMALL_DATA_IMAGES = 20_000  # a training set up to this size, given without -c, gets the hint to use that recipe
DEFAULT_EPOCHS = 300  # --epochs default, timm's ImageNet schedule (the small-data hint compares to it)
SCHEDULERS = ('cosine', 'tanh', 'step', 'multistep', 'poly', 'wsd', 'rsqrt', 'constant', 'plateau')  # timm's


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        description='mlp_vision training (timm pipeline). With no dataset argument: the handwritten-digits demo.',
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument('-c', '--config', default='', metavar='FILE|RECIPE', help='yaml file of flag values (keys: '
                        'flag names), or a recipe of configs/ by name, e.g. smlpnet_t; explicit flags override it')
    _add_data_model_args(parser)
    _add_schedule_and_regularization_args(parser)
    return parser


def _add_data_model_args(parser) -> None:
    group = parser.add_argument_group('Dataset parameters')
    add_dataset_arguments(group)
    group.add_argument('--train-split', metavar='NAME', default='train', help='dataset train split (folder / tar)')
    group.add_argument('--val-split', metavar='NAME|FRACTION', default='validation', help="a split name (folder / "
                       "tar; an error when the data has none), a fraction 0 < f < 1 of the training images held out "
                       "(class-stratified, seeded by --seed), or '' for no evaluation")
    group = parser.add_argument_group('Model parameters')
    group.add_argument('--model', default='smlpnet_t', type=str, metavar='MODEL', help='name of model to train')
    group.add_argument('--pretrained', action='store_true', help="start with the model's pretrained weights")
    group.add_argument('--pretrained-path', type=str, metavar='PATH', help="start from a local weights file, loaded "
                       "through the model's checkpoint filter (classifier dropped if --num-classes differs)")
    group.add_argument('--initial-checkpoint', default='', type=str, metavar='PATH',
                       help='start from these weights (a train.py checkpoint or a state dict of this model)')
    group.add_argument('--resume', default='', type=str, metavar='PATH', help='continue the run of this checkpoint '
                       '(usually EXP/last.pth) in its folder, with its saved settings; flags given here override them')
    group.add_argument('--keep-optimizer-state', action='store_true', help='model_best.pth and checkpoint-N.pth '
                       'hold the optimizer state too, to resume from (last.pth always does)')
    add_common_arguments(group)
    group.add_argument('--no-resume-opt', action='store_true', help='--resume: weights and epoch only, no optimizer')
    group.add_argument(ALLOW_MISSING_FLAG, action='store_true', help='--pretrained(-path): weights missing from the '
                       'file keep their random init (else an error; a classifier of another class count always does)')
    group.add_argument('--num-classes', type=int, metavar='N', help="label classes (default: the training set's)")
    add_input_arguments(group)
    group.add_argument('-b', '--batch-size', type=int, default=128, metavar='N', help='batch size per process')
    group.add_argument('-vb', '--validation-batch-size', type=int, metavar='N', help='default: --batch-size')
    group.add_argument('--grad-accum-steps', type=int, default=1, metavar='N', help='batches per optimizer step')
    group.add_argument('--grad-checkpointing', action='store_true', help='activation checkpointing through the model')
    add_compile_arguments(group)
    group = parser.add_argument_group('Device and distributed')
    add_device_arguments(group)
    group.add_argument('--sync-bn', action='store_true', help='SyncBatchNorm (CUDA, distributed)')
    group.add_argument('--dist-bn', default='reduce', choices=('reduce', 'broadcast', ''),
                       help="BatchNorm stats made equal on all ranks after each epoch (average or rank 0's)")
    group = parser.add_argument_group('Optimizer parameters')
    group.add_argument('--opt', default='sgd', type=str, metavar='OPTIMIZER', help='optimizer (timm names)')
    group.add_argument('--opt-eps', type=float, metavar='EPSILON', help='optimizer epsilon')
    group.add_argument('--opt-betas', type=float, nargs='+', metavar='BETA', help='optimizer betas')
    group.add_argument('--momentum', type=float, default=0.9, metavar='M', help='optimizer momentum')
    group.add_argument('--weight-decay', type=float, default=2e-5, help='weight decay')
    group.add_argument('--clip-grad', type=float, metavar='NORM', help='gradient clipping (off if unset)')
    group.add_argument('--clip-mode', default='norm', choices=('norm', 'value', 'agc'), help='what --clip-grad bounds')
    group.add_argument('--layer-decay', type=float, help='layer-wise learning rate decay')
    group.add_argument('--opt-kwargs', nargs='*', default={}, action=ParseKwargs, help='extra optimizer arguments')
    group = parser.add_argument_group('Miscellaneous parameters')
    group.add_argument('--seed', type=int, default=42, metavar='S', help='random seed')
    group.add_argument('--log-interval', type=int, default=50, metavar='N', help='optimizer updates between logs')
    group.add_argument('--checkpoint-hist', type=int, default=3, metavar='N', help='best checkpoint-<epoch>.pth kept')
    group.add_argument('--output', default='', type=str, metavar='PATH', help='output root (default: ./output/train)')
    group.add_argument('--experiment', default='', type=str, metavar='NAME', help='folder (default: date-model-size)')
    group.add_argument('--eval-metric', default='top1', choices=('top1', 'top5', 'loss'), help='selects the best')


def _add_schedule_and_regularization_args(parser) -> None:
    group = parser.add_argument_group('Learning rate schedule parameters')
    group.add_argument('--sched', type=str, default='cosine', choices=SCHEDULERS, help='LR scheduler')
    group.add_argument('--sched-on-updates', action='store_true', help='step the schedule every update, not epoch')
    group.add_argument('--lr', type=float, metavar='LR', help='learning rate (default: --lr-base scaled to the batch)')
    group.add_argument('--lr-base', type=float, default=0.1, metavar='LR', help='LR at --lr-base-size, without --lr')
    group.add_argument('--lr-base-size', type=int, default=256, metavar='DIV', help='global batch of --lr-base')
    group.add_argument('--lr-base-scale', default='', choices=('', 'linear', 'sqrt'),
                       help="'linear' or 'sqrt' scaling of --lr-base (default: sqrt for adaptive optimizers)")
    group.add_argument('--lr-noise', type=float, nargs='+', metavar='pct, pct', help='LR noise epochs')
    group.add_argument('--lr-noise-pct', type=float, default=0.67, metavar='PERCENT', help='LR noise limit')
    group.add_argument('--lr-noise-std', type=float, default=1.0, metavar='STDDEV', help='LR noise std-dev')
    group.add_argument('--lr-cycle-mul', type=float, default=1.0, metavar='MULT', help='LR cycle length multiplier')
    group.add_argument('--lr-cycle-decay', type=float, default=0.5, metavar='MULT', help='LR decay per cycle')
    group.add_argument('--lr-cycle-limit', type=int, default=1, metavar='N', help='LR cycle limit')
    group.add_argument('--lr-k-decay', type=float, default=1.0, help='LR k-decay for cosine / poly')
    group.add_argument('--warmup-lr', type=float, default=1e-5, metavar='LR', help='warmup learning rate')
    group.add_argument('--min-lr', type=float, default=0, metavar='LR', help='lower LR bound of cyclic schedulers')
    group.add_argument('--epochs', type=int, default=DEFAULT_EPOCHS, metavar='N', help='number of epochs to train')
    group.add_argument('--decay-milestones', default=[90, 180, 270], type=int, nargs='+', help="'multistep' epochs")
    group.add_argument('--decay-epochs', type=float, default=90, metavar='N', help="epoch interval of 'step' decay")
    group.add_argument('--warmup-epochs', type=int, default=5, metavar='N', help='epochs to warm up the LR')
    group.add_argument('--warmup-prefix', action='store_true', help='exclude warmup from the decay schedule')
    group.add_argument('--cooldown-epochs', type=int, default=0, metavar='N', help='epochs at min_lr at the end')
    group.add_argument('--patience-epochs', type=int, default=10, metavar='N', help='plateau patience')
    group.add_argument('--decay-rate', '--dr', type=float, default=0.1, help='LR decay (step, plateau), poly power')
    group = parser.add_argument_group('Augmentation and regularization parameters')
    group.add_argument('--no-aug', action='store_true', help='disable all training augmentation')
    group.add_argument('--scale', type=float, nargs='+', default=[0.08, 1.0], metavar='PCT', help='crop scale range')
    group.add_argument('--ratio', type=float, nargs='+', default=[3 / 4, 4 / 3], metavar='R', help='crop aspect range')
    group.add_argument('--hflip', type=float, default=0.5, help='horizontal flip probability')
    group.add_argument('--vflip', type=float, default=0., help='vertical flip probability')
    group.add_argument('--color-jitter', type=float, default=0.4, metavar='PCT', help='color jitter factor')
    group.add_argument('--aa', type=str, metavar='NAME', help='AutoAugment policy, e.g. rand-m9-mstd0.5-inc1')
    group.add_argument('--aug-repeats', type=float, default=0, help='repeated augmentation count (e.g. 3; 0 = off)')
    group.add_argument('--reprob', type=float, default=0., metavar='PCT', help='random erase probability')
    group.add_argument('--remode', default='pixel', choices=('pixel', 'rand', 'const'), help='random erase mode')
    group.add_argument('--recount', type=int, default=1, help='random erase count')
    group.add_argument('--mixup', type=float, default=0.0, help='mixup alpha (> 0 enables)')
    group.add_argument('--cutmix', type=float, default=0.0, help='cutmix alpha (> 0 enables)')
    group.add_argument('--cutmix-minmax', type=float, nargs='+', help='cutmix min/max ratio')
    group.add_argument('--mixup-prob', type=float, default=1.0, help='probability of mixup or cutmix per batch')
    group.add_argument('--mixup-switch-prob', type=float, default=0.5, help='probability of cutmix over mixup')
    group.add_argument('--mixup-mode', default='batch', choices=('batch', 'pair', 'elem'), help='what is mixed')
    group.add_argument('--mixup-off-epoch', default=0, type=int, metavar='N', help='turn mixup off at this epoch')
    group.add_argument('--smoothing', type=float, default=0.1, help='label smoothing')
    group.add_argument('--bce-loss', action='store_true', help='binary cross-entropy loss')
    group.add_argument('--bce-target-thresh', type=float, help='BCE target binarisation threshold')
    group.add_argument('--train-interpolation', default='random', choices=INTERPOLATIONS[1:] + ('random',),
                       help='training interpolation')
    group.add_argument('--drop', type=float, default=0.0, metavar='PCT', help='dropout rate before the classifier')
    group.add_argument('--drop-path', type=float, metavar='PCT', help='drop path (stochastic depth)')
    group = parser.add_argument_group('Model exponential moving average parameters')
    group.add_argument('--model-ema', action='store_true', help='keep an EMA of the weights')
    group.add_argument('--model-ema-force-cpu', action='store_true', help='EMA on the CPU, not evaluated in training')
    group.add_argument('--model-ema-decay', type=float, default=0.9998, help='EMA decay')
    group.add_argument('--model-ema-warmup', action='store_true', help='EMA decay warmup')


def _has_dataset(settings: Mapping[str, Any]) -> bool:  # settings: arguments by destination
    return bool(settings.get('data') or settings.get('data_dir') or settings.get('dataset'))


def parse_args(argv):
    """(args, demo: no dataset given, the resumed checkpoint) from the flags, ``-c`` and a resumed run's settings."""
    args, resume_ckpt = parse_run_args(
        build_parser(), argv, recipes=True,
        base_configs=lambda settings: [] if _has_dataset(settings) else [str(find_recipe(DEMO_RECIPE))])
    return args, not _has_dataset(vars(args)), resume_ckpt


# the range of every numeric flag (by destination: check_range's bounds); a flag of several values has each checked
_UNIT, _POSITIVE, _NON_NEGATIVE = dict(low=0, high=1), dict(low=0, low_open=True), dict(low=0)
_BELOW_ONE, _AT_LEAST_ONE = dict(low=0, high=1, high_open=True), dict(low=1)
FLAG_RANGES = {
    'epochs': _AT_LEAST_ONE, 'batch_size': _AT_LEAST_ONE, 'validation_batch_size': _AT_LEAST_ONE,
    'grad_accum_steps': _AT_LEAST_ONE, 'warmup_epochs': _NON_NEGATIVE, 'cooldown_epochs': _NON_NEGATIVE,
    'workers': _NON_NEGATIVE, 'log_interval': _AT_LEAST_ONE, 'checkpoint_hist': _NON_NEGATIVE,
    'lr_base_size': _AT_LEAST_ONE, 'lr': _POSITIVE, 'lr_base': _POSITIVE, 'warmup_lr': _NON_NEGATIVE,
    'min_lr': _NON_NEGATIVE, 'decay_epochs': _POSITIVE, 'decay_milestones': _NON_NEGATIVE,
    'decay_rate': _POSITIVE, 'patience_epochs': _NON_NEGATIVE, 'lr_cycle_mul': _POSITIVE,
    'lr_cycle_decay': _POSITIVE, 'lr_cycle_limit': _AT_LEAST_ONE, 'lr_k_decay': _POSITIVE,
    'lr_noise': _NON_NEGATIVE, 'lr_noise_pct': _NON_NEGATIVE, 'lr_noise_std': _NON_NEGATIVE,
    'opt_eps': _POSITIVE, 'opt_betas': _BELOW_ONE, 'momentum': _UNIT, 'weight_decay': _NON_NEGATIVE,
    'clip_grad': _POSITIVE, 'layer_decay': dict(low=0, high=1, low_open=True),
    'smoothing': _BELOW_ONE, 'drop': _BELOW_ONE, 'drop_path': _BELOW_ONE, 'reprob': _BELOW_ONE,
    'hflip': _UNIT, 'vflip': _UNIT, 'color_jitter': _NON_NEGATIVE, 'aug_repeats': _NON_NEGATIVE,
    'recount': _AT_LEAST_ONE, 'scale': dict(low=0, high=1, low_open=True), 'ratio': _POSITIVE,
    'mixup': _NON_NEGATIVE, 'cutmix': _NON_NEGATIVE, 'cutmix_minmax': dict(low=0, high=1, low_open=True),
    'mixup_prob': _UNIT, 'mixup_switch_prob': _UNIT, 'mixup_off_epoch': _NON_NEGATIVE,
    'bce_target_thresh': _UNIT, 'model_ema_decay': _BELOW_ONE, 'seed': dict(low=0, high=SEED_MAX),
    'num_classes': _AT_LEAST_ONE, 'img_size': _AT_LEAST_ONE, 'input_size': _AT_LEAST_ONE,
    'in_chans': _AT_LEAST_ONE, 'crop_pct': CROP_PCT_RANGE, 'threads': THREADS_RANGE, **BOUND_RANGES,
}  # --mean / --std: per channel, by check_image_args


def check_args(args, dist_info) -> None:
    """Every flag value that cannot work, as one clear message (before anything is built)."""
    check_flag_ranges(args, FLAG_RANGES)
    for dest in ('scale', 'ratio', 'cutmix_minmax', 'lr_noise'):  # (low, high); --lr-noise may give its low only
        value, flag = getattr(args, dest), '--' + dest.replace('_', '-')
        if value is not None and len(value) != 2 and not (dest == 'lr_noise' and len(value) == 1):
            raise UsageError(f'{flag} takes two values (low high), got {len(value)}')
        if value is not None and len(value) == 2 and value[0] > value[1]:
            raise UsageError(f'{flag} takes low then high, got {value[0]:g} > {value[1]:g}')
    if args.lr is not None and args.min_lr > args.lr:
        raise UsageError(f'--min-lr {args.min_lr:g} is above --lr {args.lr:g}: the schedule would raise the LR toward '
                         f'it instead of decaying; expected --min-lr <= --lr')
    if args.warmup_epochs >= args.epochs:  # allowed: a recipe's warmup in a short trial run (the demo's --epochs 1)
        _logger.warning(f'--warmup-epochs {args.warmup_epochs} is not shorter than --epochs {args.epochs}: the whole '
                        f'run is warmup, its LR rising from --warmup-lr {args.warmup_lr:g} and never reaching the '
                        f'scheduled rate; give --warmup-epochs {args.epochs - 1} or less (0: none) to train at it')
    check_image_args(args)
    check_dataset_package(args.dataset)
    check_kwargs_flags(args, 'model_kwargs', 'opt_kwargs')
    if args.opt.lower().split('_')[-1] not in list_optimizers():
        raise UsageError(f'--opt {args.opt!r} is not an optimizer timm knows (all: timm.optim.list_optimizers())')
    if args.aa:
        try:  # timm's parser of the policy string is the one that will read it
            create_transform(32, is_training=True, auto_augment=args.aa)
        except (AssertionError, ValueError, KeyError, IndexError) as e:
            raise UsageError(f'--aa {args.aa!r} is not an augmentation policy timm reads (e.g. rand-m9-mstd0.5-inc1, '
                             f'augmix-m5-w4-d2, original, v0): {e}') from None
    check_compile_backend(args.torchcompile)
    if uses_mixup(args) and args.batch_size % 2:
        raise UsageError(f'mixup / cutmix need an even --batch-size, got {args.batch_size}')
    if args.sync_bn and dist_info.device.type != 'cuda':
        raise UsageError('--sync-bn needs CUDA (PyTorch\'s SyncBatchNorm); on the CPU --dist-bn reduce (the default) '
                         'averages the BatchNorm stats every epoch')


# ------------------------------------------------------------------------------------------------ main
def main(argv=None, prog: str = PROG):
    """Train; returns the results dict on rank 0 (None on other ranks). Errors: one line starting with ``prog``."""
    return run_cli(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog):
    args, demo, resume_ckpt = parse_args(argv)
    dist_info = init_device(args.device, args.dist_backend, args.dist_url)
    setup_logging(dist_info.primary)
    check_args(args, dist_info)
    _logger.info(set_run_threads(args.threads, resume_ckpt))
    with stop_signals() as stop_signal, size_bounds(args):
        return train(args, dist_info, resume_ckpt, demo, stop_signal, command=' '.join([prog] + list(argv)))


def train(args, dist_info, resume_ckpt: Optional[dict], demo: bool, stop_signal: Callable[[], int],
          command: str) -> Optional[Dict[str, Any]]:
    """timm's ``main`` after the arguments: data, model, LR, optimizer, AMP, loaders, loss, schedule, the resumed
    state (``resume_ckpt``: the ``--resume`` checkpoint or None), EMA, DDP / compile, the run folder (rank 0), the RNG
    states, the epochs and the final stage. ``stop_signal()``: the SIGINT / SIGTERM received (0: none)."""
    device, run_start = dist_info.device, time.time()
    data_dir = _prepare_demo(args) if demo else args.data_dir or args.data
    random_seed(args.seed, dist_info.rank)
    dataset_train, dataset_eval, train_classes = _create_datasets(args, data_dir, dist_info.world_size)
    model, create_kwargs, data_config = _create_model(args, dist_info)
    if args.lr is None:  # timm's rule; derived, not saved as given: a resume at another batch scales again
        global_batch = _global_batch(args, dist_info.world_size)
        scale = args.lr_base_scale or ('sqrt' if any(o in args.opt.lower() for o in ('ada', 'lamb')) else 'linear')
        args.derive(lr=args.lr_base * (global_batch / args.lr_base_size) ** (0.5 if scale == 'sqrt' else 1),
                    **({} if args.lr_base_scale else {'lr_base_scale': scale}))
        _logger.info(f'learning rate {args.lr:.4g} = lr_base {args.lr_base:g} x {args.lr_base_scale} scaling of '
                     f'the global batch {global_batch} / {args.lr_base_size}')
        if args.min_lr > args.lr:  # check_args had no --lr to compare with
            raise UsageError(f'--min-lr {args.min_lr:g} is above the learning rate {args.lr:.4g} (from --lr-base): the '
                             f'schedule would raise the LR toward it instead of decaying; expected --min-lr <= the LR')
    try:  # timm's optimizer_kwargs reads extra arguments from `opt_args`; this script's flag is --opt-kwargs
        optimizer = create_optimizer_v2(model, **{**optimizer_kwargs(cfg=args), **args.opt_kwargs})
    except (TypeError, ValueError) as e:
        raise UsageError(f'--opt {args.opt} cannot be built with {args.opt_kwargs or "these settings"}: {e}') from e
    amp_autocast, loss_scaler, amp_dtype = setup_amp(args.amp, args.amp_dtype, device)
    loader_train, sampler_train = create_train_loader(
        dataset_train, data_config, args.batch_size, device, seed=args.seed, rank=dist_info.rank,
        world_size=dist_info.world_size, num_workers=args.workers, pin_memory=args.pin_mem,
        aug_repeats=args.aug_repeats, no_aug=args.no_aug, scale=args.scale, ratio=args.ratio, hflip=args.hflip,
        vflip=args.vflip, color_jitter=args.color_jitter, auto_augment=args.aa,
        train_interpolation=args.train_interpolation, re_prob=args.reprob, re_mode=args.remode, re_count=args.recount)
    loader_eval = create_eval_loader(
        dataset_eval, data_config, args.validation_batch_size or args.batch_size, device, num_workers=args.workers,
        distributed=dist_info.distributed, pin_memory=args.pin_mem) if dataset_eval is not None else None
    try:
        mixup_fn, train_loss_fn = _create_mixup_and_loss(args, device)
        updates_per_epoch = (len(loader_train) + args.grad_accum_steps - 1) // args.grad_accum_steps
        warn_global_batch_beyond_data(args.batch_size, dist_info.world_size, args.grad_accum_steps,
                                      len(dataset_train))
        schedule = dict(scheduler_kwargs(args, decreasing_metric=args.eval_metric == 'loss'), lr=args.lr)
        try:  # every checkpoint stores `schedule` (restore_training_state continues a changed one)
            lr_scheduler, num_epochs = create_scheduler_v2(
                optimizer, **{k: v for k, v in schedule.items() if k != 'lr'}, updates_per_epoch=updates_per_epoch)
        except (ValueError, AssertionError) as e:
            raise UsageError(f'the --sched {args.sched} schedule cannot be built: {e}') from e

        last_epoch, num_updates = restore_training_state(resume_ckpt, args.resume, args.model, model,
                                                         optimizer, lr_scheduler, schedule, loss_scaler,
                                                         weights_only=args.no_resume_opt)
        start_epoch = last_epoch + 1 if resume_ckpt is not None else 0
        check_not_finished(resume_ckpt, args.resume, start_epoch, num_epochs)
        model_ema = None
        if args.model_ema:  # a copy of the (resumed) model, before DDP / compile, as timm; then the resumed EMA
            model_ema = ModelEmaV3(model, decay=args.model_ema_decay, use_warmup=args.model_ema_warmup,
                                   device=torch.device('cpu') if args.model_ema_force_cpu else None)
            restore_ema(resume_ckpt, args.resume, args.model, model_ema.module)
        train_model = compile_model(wrap_ddp(model, dist_info) if dist_info.distributed else model, args)

        folder = open_run_folder(
            args, resume_ckpt, default_root='./output/train',
            default_name='-'.join([datetime.now().strftime('%Y%m%d-%H%M%S')] + (['demo_digits'] if demo else [])
                                  + [args.model.replace('/', '_'), str(data_config['input_size'][-1])]),
            decreasing=args.eval_metric == 'loss',
            max_history=args.checkpoint_hist) if dist_info.primary else None
        try:
            log_settings_changes(args)
            if dist_info.primary:
                _log_setup(args, dist_info, train_model, create_kwargs, data_config, amp_dtype, data_dir,
                           dataset_train, dataset_eval, loader_train, num_epochs, updates_per_epoch, start_epoch)
                if not demo:
                    _hint_small_data_recipe(args, len(dataset_train))
                _logger.info(f'Outputs: {folder.output_dir}')
            restore_rng(resume_ckpt, args.resume, dist_info)  # last: nothing built before shifts the random streams
            if resume_ckpt is not None:
                resume_ckpt.clear()  # its tensors are not needed past here: freed, the caller's reference included
            # one for the run: a stop agreed at an epoch's last update stops the next epoch's first
            updates = update_state(num_updates, stop_signal, dist_info.distributed, device)
            state = dict(model=train_model, optimizer=optimizer, scheduler=lr_scheduler, schedule=schedule,
                         loss_scaler=loss_scaler, model_cfg={'name': args.model, 'kwargs': create_kwargs},
                         data_cfg=dict(data_config),
                         class_names=train_classes)  # label order; validate.py labels class folders by these names
            metrics = _train_epochs(
                args, dist_info, folder, updates, state, model_ema, loader_train, sampler_train, loader_eval,
                mixup_fn=mixup_fn, train_loss_fn=train_loss_fn, amp_autocast=amp_autocast, start_epoch=start_epoch,
                num_epochs=num_epochs, last_saved=last_epoch if resume_ckpt is not None else None)
            results = _final_stage(
                args, dist_info, folder, model, train_model, model_ema, metrics, loader_train, loader_eval,
                create_kwargs=create_kwargs, data_config=data_config, train_classes=train_classes, data_dir=data_dir,
                demo=demo, num_epochs=num_epochs, command=command, run_start=run_start)
            if stop_signal():  # held through the final stage, which had to finish for its outputs to agree
                where = f' (results.json, pretrained/ in {folder.output_dir})' if folder is not None else ''
                raise Interrupted(stop_signal(), message=(
                    f'{signal.Signals(stop_signal()).name} arrived after the last update and was held until the '
                    f'final stage ended: the run is complete{where}'))
        except BaseException as e:
            close_run_folder(folder, e)
            raise
        close_run_folder(folder, None)
        return results
    finally:
        # end the loaders' persistent workers with the run: a later garbage collection stalled ~10 s per loader
        loader_train = loader_eval = None


def _train_epochs(args, dist_info, folder: Optional[RunFolder], updates: Dict[str, Any], state: Dict[str, Any],
                  model_ema, loader_train, sampler_train, loader_eval, *, mixup_fn, train_loss_fn, amp_autocast,
                  start_epoch: int, num_epochs: int, last_saved: Optional[int]) -> Dict[str, Any]:
    """Per epoch: :func:`train_one_epoch`, ``validate``, the schedule's step, a summary row and a checkpoint of
    ``state``; a stop signal or a NaN / inf loss ends the run with one line naming the intact checkpoint (of epoch
    ``last_saved``). Returns the last epoch's {train, eval, ema_eval}, peak_mem_gib and train_start (time.time())."""
    device, train_model, lr_scheduler = dist_info.device, state['model'], state['scheduler']
    metrics = dict(train=None, eval=None, ema_eval=None, peak_mem_gib=None, train_start=time.time())
    for epoch in range(start_epoch, num_epochs):
        if sampler_train is not None:
            sampler_train.set_epoch(epoch)
        if mixup_fn is not None and args.mixup_off_epoch and epoch >= args.mixup_off_epoch:
            mixup_fn.mixup_enabled = False
        if device.type == 'cuda':
            torch.cuda.reset_peak_memory_stats(device)  # peak_mem_gib is this epoch's (training + eval)
        try:
            metrics['train'] = train_one_epoch(
                epoch, train_model, loader_train, state['optimizer'], train_loss_fn, updates, total_epochs=num_epochs,
                amp_autocast=amp_autocast, loss_scaler=state['loss_scaler'], clip_grad=args.clip_grad,
                clip_mode=args.clip_mode, mixup_fn=mixup_fn, model_ema=model_ema, lr_scheduler=lr_scheduler,
                grad_accum_steps=args.grad_accum_steps, channels_last=args.channels_last,
                world_size=dist_info.world_size, log_interval=args.log_interval, primary=dist_info.primary)
        except (Interrupted, NonFiniteLossError) as e:
            last_path = folder.saver.last_path if folder is not None else None
            advice = 'Lower --lr, add --clip-grad or more --warmup-epochs'  # after a NaN / inf loss
            raise stop_error(e, last_path, last_saved, args.resume, advice) from None
        if dist_info.distributed and args.dist_bn in ('broadcast', 'reduce'):
            distribute_bn(train_model, dist_info.world_size, args.dist_bn == 'reduce')
        with preserve_rng():  # evaluation must not shift the training's random stream
            metric = _validate_epoch(args, dist_info, train_model, model_ema, loader_eval, amp_autocast, metrics)
        lr_scheduler.step(epoch + 1, metric)  # before saving: the checkpoint holds next epoch's LR
        trained, evaluated, ema = metrics['train'], metrics['eval'], metrics['ema_eval']
        row = {'epoch': epoch, 'lr': trained['lr'], 'train_loss': trained['loss']}
        for prefix, values in (('eval', evaluated), ('ema_eval', ema)):
            row.update({f'{prefix}_{k}': values[k] for k in ('loss', 'top1', 'top5')} if values is not None else {})
        row.update(train_img_per_sec=trained['img_per_sec'], epoch_seconds=trained['seconds'])
        if device.type == 'cuda':
            row['peak_mem_gib'] = torch.cuda.max_memory_allocated(device) / 2 ** 30
            metrics['peak_mem_gib'] = max(metrics['peak_mem_gib'] or 0., row['peak_mem_gib'])
        if folder is not None:
            folder.summary.append(row)
        written = save_checkpoint(
            folder, args, dist_info, epoch, metric, num_updates=updates['num_updates'], **state,
            state_dict_ema=model_ema.module.state_dict() if model_ema is not None else None,
            eval_metrics=evaluated, ema_eval_metrics=ema)
        last_saved = epoch
        if folder is not None:
            _logger.info(
                f'Epoch {epoch}/{num_epochs - 1}: train loss {row["train_loss"]:.4f}'
                + (f' | eval loss {evaluated["loss"]:.4f} {_accuracy_text(evaluated)}' if evaluated is not None else '')
                + (f' | EMA top1 {ema["top1"]:.2f}' if ema is not None else '')
                + f' | {row["train_img_per_sec"]:,.0f} img/s, {format_duration(row["epoch_seconds"])}'
                + (f', peak {row["peak_mem_gib"]:.2f} GiB' if 'peak_mem_gib' in row else '')
                + ' | saved last.pth' + (' + model_best.pth' if written['best'] else ''))
    return metrics


def _final_stage(args, dist_info, folder: Optional[RunFolder], model, train_model, model_ema, metrics: Dict[str, Any],
                 loader_train, loader_eval, *, create_kwargs, data_config, train_classes, data_dir: str, demo: bool,
                 num_epochs: int, command: str, run_start: float) -> Optional[Dict[str, Any]]:
    """After the last epoch (every rank): the weights' digests, the demo's validation, then on rank 0
    ``pretrained/``, ``results.json`` and the closing log lines; returns the results on rank 0."""
    if folder is not None:
        folder.in_final_stage = True  # a failure from here on is recorded in results.json
    digests = weights_digests(dist_info, model, model_ema.module if model_ema is not None else None)
    demo_val = (_validate_demo(args, dist_info, folder, data_dir, model_ema)
                if demo and loader_eval is not None else None)
    if folder is None:
        return None
    pretrained_from = _export_pretrained(args, folder, train_model, model_ema, data_config, train_classes, data_dir)
    device, best_path = dist_info.device, folder.saver.best_path
    # the best as model_best.pth itself records it: the record names what the files hold
    best = ({'epoch': pretrained_from['epoch'], 'metric': pretrained_from['metric']}
            if pretrained_from['file'] == best_path.name else None)
    results = {
        'model': args.model, 'model_kwargs': create_kwargs, 'experiment_dir': str(folder.output_dir),
        'device': str(device), 'device_name': torch.cuda.get_device_name(device) if device.type == 'cuda' else None,
        'cuda_peak_mem_gib': metrics['peak_mem_gib'],  # max over this process's epochs of max_memory_allocated
        'torch_version': torch.__version__, 'world_size': dist_info.world_size, 'epochs': num_epochs,
        'global_batch': _global_batch(args, dist_info.world_size), 'lr': args.lr, 'final_epoch': num_epochs - 1,
        'train': metrics['train'], 'eval': metrics['eval'], 'ema_eval': metrics['ema_eval'],
        'best': best, 'eval_metric': args.eval_metric, 'checkpoints': {  # None: nothing was evaluated
            'last': str(folder.saver.last_path), 'best': str(best_path) if best_path.exists() else None},
        'pretrained': str(folder.output_dir / 'pretrained'), 'pretrained_from': pretrained_from,
        'weights_sha256_per_rank': digests, 'ranks_agree': len(set(digests)) == 1,
        'train_seconds_this_process': time.time() - metrics['train_start'], 'demo_validation': demo_val,
        'skipped_images': {  # unreadable files, left out (never replaced): last epoch / last evaluation, this rank
            'train': loader_train.skipped, 'eval': loader_eval.skipped if loader_eval is not None else 0,
            'files': {**loader_train.skipped_files, **(loader_eval.skipped_files if loader_eval is not None else {})}},
        'command': command,
    }
    write_results(folder, results)
    if metrics['eval'] is not None:
        _logger.info(f'Done in {format_duration(time.time() - metrics["train_start"])}: final eval '
                     f'{_accuracy_text(metrics["eval"])} loss {metrics["eval"]["loss"]:.4f}'
                     + (f'; best {args.eval_metric} {best["metric"]:.4f} at epoch {best["epoch"]}' if best else ''))
    if demo_val is not None:
        _logger.info(f'Demo result: validation accuracy {demo_val["top1"]:.2f}% top-1 on {demo_val["samples"]} '
                     f'held-out digit images (chance: 10%), checkpoint {best_path}; total time '
                     f'{format_duration(time.time() - run_start)}.')
    names = sorted(p.name for p in folder.output_dir.iterdir() if not p.name.startswith('.'))
    _logger.info(f'Outputs in {folder.output_dir}: {", ".join(names)}')
    return results


def update_state(num_updates: int = 0, stop_signal: Optional[Callable[[], int]] = None, distributed: bool = False,
                 device: torch.device = torch.device('cpu'), agree_every_s: float = 2.) -> Dict[str, Any]:
    """What one optimizer update carries to the next (:func:`train_one_epoch`): ``num_updates``, ``stop_signal()``
    (this process's SIGINT / SIGTERM, 0: none), a stop agreed at the last update, the agreements' spacing."""
    return dict(num_updates=num_updates, stop_signal=stop_signal or (lambda: 0), distributed=distributed, device=device,
                agree_every_s=agree_every_s, stop_pending=0, check_every=1, micro_seconds=float('inf'))


def train_one_epoch(epoch: int, model: nn.Module, loader, optimizer: torch.optim.Optimizer, loss_fn: Callable,
                    updates: Dict[str, Any], *, total_epochs: int, amp_autocast=suppress, loss_scaler=None,
                    clip_grad: Optional[float] = None, clip_mode: str = 'norm', mixup_fn=None, model_ema=None,
                    lr_scheduler=None, grad_accum_steps: int = 1, channels_last: bool = False, world_size: int = 1,
                    log_interval: int = 50, primary: bool = True) -> Dict[str, float]:
    """timm's ``train_one_epoch``: per optimizer update, ``grad_accum_steps`` batches of forward, loss and backward
    (DDP syncs the gradients on the last one only), then clipping, the optimizer step, the EMA and the per-update LR
    schedule. ``updates``: the run's :func:`update_state`. An update waits for the device and the other ranks once,
    at :func:`_agree` before its last backward pass: a NaN / inf loss on any rank stops the run before the optimizer
    step (:class:`NonFiniteLossError`); a SIGINT / SIGTERM on any rank, before the next update
    (:class:`~mlp_vision.errors.Interrupted`). Returns {'loss', 'lr', 'img_per_sec', 'seconds'} over every rank."""
    model.train()
    num_batches = len(loader)
    updates_per_epoch = (num_batches + grad_accum_steps - 1) // grad_accum_steps
    batches, device = iter(loader), updates['device']
    # one batch ahead: with one process the loader leaves out batches whose images were all unreadable, so the epoch
    # may end before len(loader) batches; the last batch that comes is then the update's last
    pending = next(batches, None)
    clip_parameters = partial(model_parameters, model, exclude_head='agc' in clip_mode)
    loss_sum, sample_count, window_loss, window_samples = 0., 0., 0., 0.
    epoch_start = time.perf_counter()
    optimizer.zero_grad()
    for update_idx in range(updates_per_epoch):
        if pending is None:
            break
        first = update_idx * grad_accum_steps  # the update's first batch
        accum_steps = min(grad_accum_steps, num_batches - first)
        stopped_at = f'epoch {epoch}, batch {first}'
        signum = updates['stop_pending'] or (0 if updates['distributed'] else updates['stop_signal']())
        if signum:
            raise Interrupted(signum, stopped_at)
        # this update's losses on the device (no host sync): [weighted sum, first non-finite batch or -1, its value]
        sums = torch.tensor([0., -1., 0.], dtype=torch.float64, device=device)
        weight_sum, since, since_micro, next_check = 0., time.perf_counter(), 0, updates['check_every']
        for micro in range(accum_steps):
            if micro and not updates['distributed'] and updates['stop_signal']():  # the weights stay as they were
                optimizer.zero_grad(set_to_none=True)
                raise Interrupted(updates['stop_signal'](), stopped_at)
            (input, target), pending = pending, next(batches, None)
            need_update = micro == accum_steps - 1 or pending is None
            if mixup_fn is not None:
                input, target = mixup_fn(input, target)
            if channels_last:
                input = input.contiguous(memory_format=torch.channels_last)
            no_sync = getattr(model, 'no_sync', None)
            with no_sync() if no_sync is not None and not need_update else nullcontext():
                with amp_autocast():
                    loss = loss_fn(model(input), target)
                value = loss.detach().reshape(()).to(torch.float64)
                first_bad = ~torch.isfinite(value) & (sums[1] < 0)  # the update's first non-finite loss
                sums[0] += value * input.shape[0]
                sums[1] = torch.where(first_bad, float(micro), sums[1])
                sums[2] = torch.where(first_bad, value, sums[2])
                weight_sum += input.shape[0]
                if need_update:  # before the backward pass that reduces the gradients, and the optimizer step
                    update_loss, updates['stop_pending'] = _agree(updates, optimizer, sums, micro + 1 - since_micro,
                                                                  since, (epoch, first))
                if loss_scaler is not None:  # timm's NativeScaler (float16 AMP): the scaled backward, clipping, step
                    loss_scaler(loss / accum_steps, optimizer, clip_grad=clip_grad, clip_mode=clip_mode,
                                parameters=clip_parameters() if clip_grad else None, need_update=need_update)
                else:
                    (loss / accum_steps).backward()
                    if need_update:
                        if clip_grad is not None:
                            dispatch_clip_grad(clip_parameters(), value=clip_grad, mode=clip_mode)
                        optimizer.step()
            if not need_update and micro + 1 == next_check:  # a long update agrees every few seconds
                _, signum = _agree(updates, optimizer, sums, micro + 1 - since_micro, since, (epoch, first))
                if signum:
                    optimizer.zero_grad(set_to_none=True)
                    raise Interrupted(signum, stopped_at)
                since, since_micro, next_check = time.perf_counter(), micro + 1, micro + 1 + updates['check_every']
            if need_update:
                break
        optimizer.zero_grad(set_to_none=True)
        updates['num_updates'] += 1
        loss_sum, sample_count = loss_sum + update_loss, sample_count + weight_sum
        window_loss, window_samples = window_loss + update_loss, window_samples + weight_sum
        if model_ema is not None:
            model_ema.update(model, step=updates['num_updates'])
        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=updates['num_updates'], metric=loss_sum / sample_count)

        now = time.perf_counter()
        if update_idx == 0:  # the first update includes loader start-up: the rate counts from its end
            first_done = now
        last = pending is None or update_idx == updates_per_epoch - 1
        if primary and (last or (update_idx + 1) % log_interval == 0):
            sec_per_update = (now - first_done) / update_idx if update_idx else now - epoch_start
            img_per_sec = weight_sum * world_size / sec_per_update if sec_per_update > 0 else 0.
            left_epoch = (updates_per_epoch - update_idx - 1) * sec_per_update
            left_run = left_epoch + (total_epochs - epoch - 1) * updates_per_epoch * sec_per_update
            _logger.info(
                f'Train: {epoch}/{total_epochs - 1} [{update_idx + 1:>{len(str(updates_per_epoch))}d}/'
                f'{updates_per_epoch} ({100. * (update_idx + 1) / updates_per_epoch:3.0f}%)]  loss '
                f'{window_loss / max(window_samples, 1):.4f} ({loss_sum / sample_count:.4f})  lr '
                f'{optimizer.param_groups[0]["lr"]:.3e}  {img_per_sec:,.0f} img/s  ETA epoch '
                f'{format_duration(left_epoch)}, training {format_duration(left_run)}')
            window_loss, window_samples = 0., 0.

    seconds = time.perf_counter() - epoch_start
    totals = torch.tensor([loss_sum, sample_count], dtype=torch.float64, device=device)
    if updates['distributed']:
        dist.all_reduce(totals)
    total_loss, total_samples = totals.tolist()
    if not total_samples:
        raise RunError(f'no training batch of epoch {epoch} kept a readable image (see the warnings above): fix or '
                       f'remove the unreadable files')
    lr = sum(g['lr'] for g in optimizer.param_groups) / len(optimizer.param_groups)
    return {'loss': total_loss / total_samples, 'lr': lr, 'img_per_sec': total_samples / seconds, 'seconds': seconds}


_NO_BAD_MICRO = float(2 ** 52)  # above any batch index, exact in float64


def _agree(updates: Dict[str, Any], optimizer, sums: torch.Tensor, micro_batches_since: int, since: float,
           at: Tuple[int, int]) -> Tuple[float, int]:
    """The one wait of an update: its losses read with one device-to-host copy, and one all-reduce (MAX) of [first
    non-finite batch, stop signal, seconds per batch], so every rank decides the same: a non-finite loss anywhere
    raises :class:`NonFiniteLossError` (gradients dropped; ``at``: the epoch and the update's first batch). Returns
    (this rank's weighted loss sum, the agreed stop signal). A long update agrees at batches counted from the slowest
    rank's time per batch, so every rank calls the same collectives in order."""
    packed = torch.zeros(6, dtype=torch.float64, device=updates['device'])
    # MAX of (first bad batch counted down from 2**52): the earliest bad batch of any rank, 0 if none
    packed[0] = (sums[1] >= 0) * (_NO_BAD_MICRO - sums[1])
    packed[1] = updates['stop_signal']()
    packed[2] = updates['micro_seconds']
    packed[3:] = sums
    if updates['distributed']:
        dist.all_reduce(packed[:3], op=dist.ReduceOp.MAX)
    first_bad, signum, seconds, loss_sum, bad_micro, bad_value = packed.tolist()
    # the spacing from the last agreement's time (the same on every rank); this one's, measured after the device
    # caught up with the host here, goes into the next agreement
    updates['check_every'] = max(1, int(updates['agree_every_s'] / max(seconds, 1e-9)))
    updates['micro_seconds'] = (time.perf_counter() - since) / max(micro_batches_since, 1)
    if first_bad:
        optimizer.zero_grad(set_to_none=True)
        micro = int(bad_micro) if bad_micro >= 0 else int(_NO_BAD_MICRO - first_bad)  # this rank's, or another's
        where = f'epoch {at[0]}, batch {at[1] + micro} (optimizer update {updates["num_updates"]})'
        raise NonFiniteLossError(bad_value if bad_micro >= 0 else 0., where)  # 0.: 'not finite on another rank'
    return loss_sum, int(signum)


def format_duration(seconds: float) -> str:
    return str(timedelta(seconds=int(round(max(0., seconds)))))


def warn_global_batch_beyond_data(batch_size: int, world_size: int, grad_accum_steps: int, samples: int) -> None:
    """Warn when one update's global batch is larger than the training set (``-b 1e9``: no other sign of it)."""
    if (global_batch := batch_size * world_size * grad_accum_steps) > samples:
        _logger.warning(f'the global batch ({batch_size} x {world_size} processes x {grad_accum_steps} accumulation '
                        f'steps = {global_batch:,}) is larger than the training data ({samples:,} images); lower -b '
                        f'/ --grad-accum-steps')


# ------------------------------------------------------------------------------------------------ distributed
def wrap_ddp(model: nn.Module, info: DistInfo) -> nn.Module:
    """DistributedDataParallel (``device_ids`` on CUDA), its gradients given their parameter's strides: a convolution
    returns its weight gradient in its input's memory format (a 1x1 conv of a channels-last activation: strides
    (C_in, 1, C_in, C_in) for a (C_in, 1, 1, 1) parameter), which autograd accepts but DDP's reducer warns about
    ("Grad strides do not match bucket view strides") on every rank; the restrided view is the same memory."""
    def restride(param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        if (grad.layout != torch.strided or grad.shape != param.shape or grad.stride() == param.stride()
                or any(g != p for g, p, n in zip(grad.stride(), param.stride(), param.shape) if n != 1)):
            return grad
        return grad.as_strided(grad.shape, param.stride(), grad.storage_offset())

    for param in model.parameters():
        if param.requires_grad and 1 in param.shape:
            param.register_hook(partial(restride, param))
    return nn.parallel.DistributedDataParallel(model, device_ids=[info.device] if info.device.type == 'cuda' else None)


def weights_digests(dist_info: DistInfo, *modules: Optional[nn.Module]) -> List[str]:
    """Every rank's SHA-256 of the weights (tensor names, dtypes, shapes, bytes); logs an error if they differ."""
    h = hashlib.sha256()
    for module in filter(None, modules):
        for k, v in unwrap_model(module).state_dict().items():
            v = v.detach().cpu().contiguous()
            h.update(f'{k}:{v.dtype}:{tuple(v.shape)};'.encode())
            h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b'')
    digests = all_gather_objects(h.hexdigest(), dist_info)
    if len(set(digests)) != 1:
        _logger.error(f'weights differ across ranks: {digests}')
    return digests


# ------------------------------------------------------------------------------------------------ what main builds
def _prepare_demo(args) -> str:
    """The demo's data: scikit-learn's digits as an ImageFolder tree (written once); returns its folder."""
    args.derive(data_dir=str(prepare_digits_folder()), dataset='', train_split='train', val_split='val')
    _logger.info(f'Demo: no dataset was given, so this trains a small model on scikit-learn\'s handwritten digits '
                 f'(1,797 real 8x8 scans, 10 classes; an ImageFolder tree under {args.data_dir}) through the same '
                 f'pipeline as an ImageNet run (recipe {DEMO_RECIPE}). For your own photos: -c {OWN_FOLDER_RECIPE} '
                 f'--data-dir DIR (README, "Your own photos").')
    return args.data_dir


def _create_datasets(args, data_dir, world_size: int):
    """(training set, evaluation set or None, the training set's class names); sets --num-classes if unset, and a
    --batch-size above the training set's images per process to all of them (an iterable dataset keeps it)."""
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
    if not isinstance(dataset_train, torch.utils.data.IterableDataset):  # before the lr is scaled to the batch
        batch_size = fit_batch_to_data(  # mixing pairs the images of a batch: an even one
            args.batch_size, train_samples_per_rank(dataset_train, world_size, args.aug_repeats), even=uses_mixup(args))
        if batch_size != args.batch_size:
            args.derive(batch_size=batch_size)
    return dataset_train, dataset_eval, train_classes


def _create_model(args, dist_info):
    """The model on its device with its starting weights; returns (model, create kwargs, data config)."""
    img_size = args.input_size[-2:] if args.input_size else args.img_size
    # models with a fixed input size (ours, ViTs) are built for --img-size; others just get resized inputs
    takes_img_size = timm.is_model(args.model) and timm.models.get_pretrained_cfg_value(args.model, 'fixed_input_size')
    create_kwargs = model_create_kwargs(
        num_classes=args.num_classes, in_chans=args.in_chans or (args.input_size[0] if args.input_size else None),
        img_size=img_size if takes_img_size else None, drop_rate=args.drop, drop_path_rate=args.drop_path,
        global_pool=args.gp, model_kwargs=args.model_kwargs)
    model = create_model(args.model, pretrained=args.pretrained, allow_missing=args.allow_missing_weights,
                         **create_kwargs)
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


def _create_mixup_and_loss(args, device):
    """(timm's Mixup / CutMix or None, the training loss that matches its soft or hard targets)."""
    mixup_fn = Mixup(
        mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, cutmix_minmax=args.cutmix_minmax, prob=args.mixup_prob,
        switch_prob=args.mixup_switch_prob, mode=args.mixup_mode, label_smoothing=args.smoothing,
        num_classes=args.num_classes) if uses_mixup(args) else None
    if args.bce_loss:  # timm's BCE one-hot encodes (and smooths) class indices; mixup's soft targets pass as they are
        train_loss_fn = BinaryCrossEntropy(smoothing=args.smoothing, target_threshold=args.bce_target_thresh)
    elif mixup_fn is not None:
        train_loss_fn = SoftTargetCrossEntropy()
    else:
        train_loss_fn = LabelSmoothingCrossEntropy(args.smoothing) if args.smoothing else nn.CrossEntropyLoss()
    return mixup_fn, train_loss_fn.to(device=device)


def uses_mixup(args) -> bool:  # mixup or cutmix is on
    return args.mixup > 0 or args.cutmix > 0 or args.cutmix_minmax is not None


def _global_batch(args, world_size: int) -> int:
    return args.batch_size * world_size * args.grad_accum_steps


# ------------------------------------------------------------------------------------------------ the log
def _log_setup(args, dist_info, model, create_kwargs, data_config, amp_dtype, data_dir, dataset_train, dataset_eval,
               loader_train, num_epochs: int, updates_per_epoch: int, start_epoch: int) -> None:
    """The setup lines of the log: model, data (the folder or tar found for each split), schedule."""
    world = dist_info.world_size
    processes = f' x {world} processes (backend {dist.get_backend()})' if dist_info.distributed else ''
    _logger.info(
        f'Model {args.model} ({sum(p.numel() for p in model.parameters()) / 1e6:.3f} M params, {create_kwargs}) on '
        f'{dist_info.device}{processes}; input {data_config["input_size"]}, AMP {amp_dtype if args.amp else "off"}')
    train_source, val_images, val_source = dataset_source(dataset_train) or args.train_split, 0, 'none'
    if dataset_eval is not None:
        val_images, val_source = len(dataset_eval), dataset_source(dataset_eval) or args.val_split
    _logger.info(f'Data {data_dir or args.dataset}: {len(dataset_train)} training images ({train_source}), '
                 f'{val_images} validation images ({val_source}), {args.num_classes} classes')
    samples, images = len(loader_train) * args.batch_size * world, len(dataset_train)
    _logger.info(  # an epoch may sample less than the training set (the loader's warning says why)
        f'Training {num_epochs} epochs x {updates_per_epoch} updates, global batch {_global_batch(args, world)}, '
        f'{args.opt} lr {args.lr:.4g}, {args.sched} schedule'
        + (f'; an epoch trains {samples:,} samples of the {images:,} images' if samples < images else '')
        + (f'; resuming at epoch {start_epoch} from {args.resume}' if args.resume else ''))


def _hint_small_data_recipe(args, num_images: int) -> None:
    """Name the shipped recipe for a small training set given no -c recipe and timm's ImageNet schedule."""
    if args.config or args.resume or num_images > SMALL_DATA_IMAGES or args.epochs != DEFAULT_EPOCHS:
        return
    _logger.warning(
        f'no -c recipe: {num_images:,} training images get timm\'s ImageNet defaults ({args.epochs} epochs of '
        f'--opt {args.opt}, {args.model} at {args.img_size or "its default size"}{" px" if args.img_size else ""}), '
        f'made for a million images on GPUs: hours on a CPU; for a small folder on a CPU, -c {OWN_FOLDER_RECIPE} '
        f'trains a small model in minutes (configs/{OWN_FOLDER_RECIPE}.yaml)')


def _validate_epoch(args, dist_info, model, model_ema, loader_eval, amp_autocast, metrics: Dict[str, Any]):
    """:func:`validate` the model (and its EMA) into ``metrics``; returns the metric that selects the best (or None)."""
    if loader_eval is None:
        return None
    validate_on = partial(validate, loader=loader_eval, amp_autocast=amp_autocast, log_interval=0,
                          channels_last=args.channels_last, distributed=dist_info.distributed,
                          primary=dist_info.primary)
    metrics['eval'] = validate_on(model)
    if model_ema is None or args.model_ema_force_cpu:
        return metrics['eval'][args.eval_metric]
    if dist_info.distributed and args.dist_bn in ('broadcast', 'reduce'):
        distribute_bn(model_ema, dist_info.world_size, args.dist_bn == 'reduce')
    metrics['ema_eval'] = validate_on(model_ema.module)
    return metrics['ema_eval'][args.eval_metric]  # as timm: EMA selects the best checkpoint


def _accuracy_text(metrics: dict) -> str:
    """``'top1 97.25 top5 99.75'``; top-5 only where it means something (more than 5 classes)."""
    return f'top1 {metrics["top1"]:.2f}' + (f' top5 {metrics["top5"]:.2f}' if metrics['top5'] is not None else '')


# ------------------------------------------------------------------------------------------------ the end of a run
def _validate_demo(args, dist_info, folder: Optional[RunFolder], data_dir: str, model_ema) -> Dict[str, Any]:
    """The demo's closing validation of its best checkpoint by the validation command, split over every rank."""
    best_path = Path(all_gather_objects(str(folder.saver.best_path) if folder is not None else '', dist_info)[0])
    val_argv = ['--checkpoint', str(best_path), '--data-dir', data_dir, '--split', args.val_split,
                '--workers', str(args.workers), '--results-file', str(best_path.parent / 'validate_best.json'),
                '--threads', str(torch.get_num_threads())]  # the training's count: the load now includes this run
    if model_ema is not None and not args.model_ema_force_cpu:
        val_argv.append('--use-ema')  # the EMA weights' accuracy chose the best checkpoint
    _logger.info('Demo: validating the saved best checkpoint with the validation command:\n'
                 '  python -m mlp_vision.validate ' + ' '.join(val_argv))
    from mlp_vision.validate import main as validate_main  # the demo's last step: kept off the path to training
    return validate_main(val_argv)


_UPSTREAM_CFG_KEYS = ('tag', 'license', 'description', 'origin_url', 'paper_name', 'paper_ids', 'notes', 'url',
                      'file', 'hf_hub_id', 'hf_hub_filename', 'source')


def _export_pretrained(args, folder: RunFolder, train_model, model_ema, data_config, train_classes,
                       data_dir: str) -> Dict[str, Any]:
    """``pretrained/`` for ``timm.create_model('local-dir:RUN/pretrained', pretrained=True)``, written atomically by
    timm's ``save_for_hf`` (files a user put there are kept): the best weights (the EMA's where its accuracy chose
    them; the last epoch's when nothing was evaluated). Returns {file, epoch, metric, ema} of the weights it holds."""
    source = folder.saver.best_path if folder.saver.best_path.exists() else folder.saver.last_path
    ckpt = load_checkpoint_file(source, what=source.name)
    use_ema = model_ema is not None and ckpt.get('state_dict_ema') is not None
    model = copy.deepcopy(unwrap_model(train_model)).cpu().to(memory_format=torch.contiguous_format)
    load_model_weights(model, ckpt['state_dict_ema' if use_ema else 'state_dict'], str(source), ckpt.get('arch'))
    # the architecture's cfg names the upstream weights (tag, license, paper): this export describes the run instead
    model.pretrained_cfg = {k: v for k, v in model.pretrained_cfg.items() if k not in _UPSTREAM_CFG_KEYS}
    data = args.dataset or (Path(data_dir).resolve().name if data_dir else 'unnamed data')
    start = (f', starting from {Path(args.initial_checkpoint).name}' if args.initial_checkpoint else
             f', starting from timm\'s pretrained {args.model}' if args.pretrained else '')
    model_config = {'pretrained_cfg': {
        'description': f'{args.model} trained by mlp_vision from {data}, {model.num_classes} classes{start}'}}
    if train_classes:
        model_config['label_names'] = list(train_classes)
    export = folder.output_dir / 'pretrained'
    with atomic_folder(export) as tmp:
        save_for_hf(model, tmp, model_config=model_config, safe_serialization=True, data_config=data_config)
    _logger.info(f'{export}: the {"EMA " if use_ema else ""}weights of {source.name} (epoch {ckpt.get("epoch")}) '
                 f"for timm (timm.create_model('local-dir:{export}', pretrained=True), features_only=True too)")
    return {'file': source.name, 'epoch': ckpt.get('epoch'), 'metric': ckpt.get('metric'), 'ema': use_ema}


if __name__ == '__main__':
    main(prog='python -m mlp_vision.train')
