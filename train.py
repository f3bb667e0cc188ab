#!/usr/bin/env python3
""" mlp_vision training script: timm's ImageNet training pipeline for the registered models (and any timm model).

Flags follow timm's train.py; ``-c/--config`` reads a yaml file whose keys are the flag names (explicit flags
win). The recipes of the papers are in ``configs/`` (see the comments there for global batch and LR scaling).

    # the demo: no dataset given -> scikit-learn's bundled handwritten digits, a small model, a few minutes on CPU
    python train.py

    # one process (CPU or one GPU)
    python train.py -c configs/smlpnet_t.yaml --data-dir /data/imagenet

    # N processes on one machine (NCCL on GPUs, gloo on CPU); multi-node: add torchrun's rendezvous flags
    torchrun --nproc_per_node=8 train.py -c configs/smlpnet_t.yaml --data-dir /data/imagenet

    # continue a run (same experiment folder): model, optimizer, scheduler, EMA, scaler, epoch, RNG, history
    python train.py -c configs/smlpnet_t.yaml --data-dir /data/imagenet --resume output/train/EXP/last.pth

Outputs (experiment folder ``--output/--experiment``): ``args.yaml``, ``train.log``, ``summary.csv``,
``last.pth``, ``model_best.pth``, ``checkpoint-<epoch>.pth`` (top ``--checkpoint-hist``), ``results.json``,
``curves.png``. Checkpoints are written atomically, once per epoch; a run killed at any point resumes from
``last.pth`` and (on CPU, one process) ends with bit-identical weights to an uninterrupted run.
"""
import argparse
import logging
import os
import sys
import time
from contextlib import suppress
from datetime import datetime
from functools import partial
from pathlib import Path

import timm
import torch
import torch.nn as nn
from timm.data import Mixup, resolve_data_config
from timm.loss import BinaryCrossEntropy, LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2, optimizer_kwargs
from timm.scheduler import create_scheduler_v2, scheduler_kwargs
from timm.utils import ModelEmaV3, NativeScaler, ParseKwargs, distribute_bn, get_outdir, random_seed, unwrap_model

from mlp_vision.training import UsageError
from mlp_vision.training.checkpoint import (
    CHECKPOINT_VERSION, CheckpointManager, get_rng_state, is_training_checkpoint, load_checkpoint_file,
    load_model_weights, preserve_rng, set_rng_state)
from mlp_vision.training.config import args_to_yaml, parse_args_with_config
from mlp_vision.training.data import (
    check_num_classes, create_eval_loader, create_image_dataset, create_train_loader, dataset_class_names,
    prepare_digits_folder)
from mlp_vision.training.distributed import all_gather_objects, init_device, state_dict_digest, wrap_ddp
from mlp_vision.training.engine import (
    NonFiniteLossError, evaluate, format_duration, non_finite_exit, train_one_epoch)
from mlp_vision.training.log import add_log_file, remove_log_file, setup_logging
from mlp_vision.training.model import create_model, model_create_kwargs
from mlp_vision.training.summary import SummaryWriter, plot_curves, write_json

_logger = logging.getLogger('train')

REPO_DIR = Path(__file__).resolve().parent
DEMO_CONFIG = REPO_DIR / 'configs' / 'demo_digits.yaml'


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description='mlp_vision training (timm pipeline). With no dataset argument: the handwritten-digits demo.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('-c', '--config', default='', type=str, metavar='FILE',
                        help='yaml file of flag values (keys = flag names); explicit flags override it')

    group = parser.add_argument_group('Dataset parameters')
    group.add_argument('data', nargs='?', metavar='DIR', help='path to dataset (positional, same as --data-dir)')
    group.add_argument('--data-dir', metavar='DIR', help='path to dataset root (ImageFolder tree or folder of tars)')
    group.add_argument('--dataset', metavar='NAME', default='',
                       help="dataset type + name ('' = image folder / tar, torch/cifar10, hfds/NAME, wds/...)")
    group.add_argument('--train-split', metavar='NAME', default='train', help='dataset train split (folder / tar)')
    group.add_argument('--val-split', metavar='NAME', default='validation',
                       help="dataset validation split ('' for no evaluation)")
    group.add_argument('--dataset-download', action='store_true', default=False,
                       help='allow download of dataset for torch/ and tfds/ datasets that support it')
    group.add_argument('--class-map', default='', type=str, metavar='FILENAME',
                       help='path to class to idx mapping file')
    group.add_argument('--input-img-mode', default='RGB', type=str, help='dataset image conversion mode')

    group = parser.add_argument_group('Model parameters')
    group.add_argument('--model', default='smlpnet_t', type=str, metavar='MODEL', help='name of model to train')
    group.add_argument('--pretrained', action='store_true', default=False, help="start with the model's pretrained weights")
    group.add_argument('--pretrained-path', default=None, type=str, metavar='PATH',
                       help="start from a local weights file, loaded through the model's checkpoint filter "
                            "(official / timm layouts; classifier dropped if --num-classes differs)")
    group.add_argument('--initial-checkpoint', default='', type=str, metavar='PATH',
                       help='load these weights (a train.py checkpoint or a state dict of this exact model) first')
    group.add_argument('--resume', default='', type=str, metavar='PATH',
                       help='resume the full training state from this checkpoint (usually EXP/last.pth)')
    group.add_argument('--no-resume-opt', action='store_true', default=False,
                       help='with --resume: load weights and epoch only, not optimizer / scaler / scheduler')
    group.add_argument('--num-classes', type=int, default=None, metavar='N',
                       help='number of label classes (default: the training set\'s)')
    group.add_argument('--gp', default=None, type=str, metavar='POOL', help='global pool type (model default)')
    group.add_argument('--img-size', type=int, default=None, metavar='N',
                       help='image size (the model is built for it; default: the model\'s)')
    group.add_argument('--in-chans', type=int, default=None, metavar='N', help='image input channels')
    group.add_argument('--input-size', default=None, nargs=3, type=int, metavar='N',
                       help='input dimensions (d h w), overrides --img-size')
    group.add_argument('--crop-pct', default=None, type=float, metavar='N', help='eval center crop pct')
    group.add_argument('--mean', type=float, nargs='+', default=None, metavar='MEAN', help='override mean')
    group.add_argument('--std', type=float, nargs='+', default=None, metavar='STD', help='override std')
    group.add_argument('--interpolation', default='', type=str, metavar='NAME', help='eval resize interpolation')
    group.add_argument('-b', '--batch-size', type=int, default=128, metavar='N', help='batch size per process')
    group.add_argument('-vb', '--validation-batch-size', type=int, default=None, metavar='N',
                       help='validation batch size (default: --batch-size)')
    group.add_argument('--channels-last', action='store_true', default=False, help='use channels_last memory layout')
    group.add_argument('--grad-accum-steps', type=int, default=1, metavar='N',
                       help='accumulate gradients over N batches per optimizer step')
    group.add_argument('--grad-checkpointing', action='store_true', default=False,
                       help='activation checkpointing through the model')
    group.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs,
                       help='extra model arguments k=v (python literals), e.g. embed_dim=32 depths="(1,1,2,1)"')
    group.add_argument('--torchcompile', nargs='?', type=str, default=None, const='inductor',
                       help='torch.compile the model (optional backend, default inductor)')
    group.add_argument('--torchcompile-mode', type=str, default=None, help='torch.compile mode')

    group = parser.add_argument_group('Device and distributed')
    group.add_argument('--device', default=None, type=str, help="'cuda', 'cuda:1', 'cpu' (default: cuda if available)")
    group.add_argument('--dist-backend', default=None, type=str, help='default: nccl for CUDA, gloo for CPU')
    group.add_argument('--dist-url', default=None, type=str, help="default: 'env://' (torchrun)")
    group.add_argument('--sync-bn', action='store_true', default=False, help='SyncBatchNorm (CUDA, distributed)')
    group.add_argument('--dist-bn', type=str, default='reduce', choices=('reduce', 'broadcast', ''),
                       help='after each epoch, make BatchNorm stats equal on all ranks (average or rank 0)')
    group.add_argument('--amp', action='store_true', default=False,
                       help='mixed precision: bfloat16 autocast on CPU, float16 (+ grad scaler) on CUDA')
    group.add_argument('--amp-dtype', default=None, type=str, choices=('float16', 'bfloat16'),
                       help='autocast dtype (default: bfloat16 on CPU, float16 on CUDA)')

    group = parser.add_argument_group('Optimizer parameters')
    group.add_argument('--opt', default='sgd', type=str, metavar='OPTIMIZER', help='optimizer (timm names)')
    group.add_argument('--opt-eps', default=None, type=float, metavar='EPSILON', help='optimizer epsilon')
    group.add_argument('--opt-betas', default=None, type=float, nargs='+', metavar='BETA', help='optimizer betas')
    group.add_argument('--momentum', type=float, default=0.9, metavar='M', help='optimizer momentum')
    group.add_argument('--weight-decay', type=float, default=2e-5, help='weight decay')
    group.add_argument('--clip-grad', type=float, default=None, metavar='NORM', help='gradient clipping (off if unset)')
    group.add_argument('--clip-mode', type=str, default='norm', help="'norm', 'value' or 'agc'")
    group.add_argument('--layer-decay', type=float, default=None, help='layer-wise learning rate decay')
    group.add_argument('--opt-kwargs', nargs='*', default={}, action=ParseKwargs, help='extra optimizer arguments')

    group = parser.add_argument_group('Learning rate schedule parameters')
    group.add_argument('--sched', type=str, default='cosine', metavar='SCHEDULER', help='LR scheduler')
    group.add_argument('--sched-on-updates', action='store_true', default=False,
                       help='step the schedule every optimizer update instead of every epoch')
    group.add_argument('--lr', type=float, default=None, metavar='LR',
                       help='learning rate (default: --lr-base scaled to the global batch)')
    group.add_argument('--lr-base', type=float, default=0.1, metavar='LR',
                       help='learning rate at --lr-base-size global batch, used when --lr is not given')
    group.add_argument('--lr-base-size', type=int, default=256, metavar='DIV', help='global batch of --lr-base')
    group.add_argument('--lr-base-scale', type=str, default='', metavar='SCALE',
                       help="'linear' or 'sqrt' scaling of --lr-base (default: sqrt for adaptive optimizers)")
    group.add_argument('--lr-noise', type=float, nargs='+', default=None, metavar='pct, pct', help='LR noise epochs')
    group.add_argument('--lr-noise-pct', type=float, default=0.67, metavar='PERCENT', help='LR noise limit')
    group.add_argument('--lr-noise-std', type=float, default=1.0, metavar='STDDEV', help='LR noise std-dev')
    group.add_argument('--lr-cycle-mul', type=float, default=1.0, metavar='MULT', help='LR cycle length multiplier')
    group.add_argument('--lr-cycle-decay', type=float, default=0.5, metavar='MULT', help='LR decay per cycle')
    group.add_argument('--lr-cycle-limit', type=int, default=1, metavar='N', help='LR cycle limit')
    group.add_argument('--lr-k-decay', type=float, default=1.0, help='LR k-decay for cosine / poly')
    group.add_argument('--warmup-lr', type=float, default=1e-5, metavar='LR', help='warmup learning rate')
    group.add_argument('--min-lr', type=float, default=0, metavar='LR', help='lower LR bound of cyclic schedulers')
    group.add_argument('--epochs', type=int, default=300, metavar='N', help='number of epochs to train')
    group.add_argument('--decay-milestones', default=[90, 180, 270], type=int, nargs='+', metavar='MILESTONES',
                       help="epochs of 'multistep' LR decay")
    group.add_argument('--decay-epochs', type=float, default=90, metavar='N', help="epoch interval of 'step' decay")
    group.add_argument('--warmup-epochs', type=int, default=5, metavar='N', help='epochs to warm up the LR')
    group.add_argument('--warmup-prefix', action='store_true', default=False,
                       help='exclude warmup from the decay schedule')
    group.add_argument('--cooldown-epochs', type=int, default=0, metavar='N', help='epochs at min_lr at the end')
    group.add_argument('--patience-epochs', type=int, default=10, metavar='N', help='plateau patience')
    group.add_argument('--decay-rate', '--dr', type=float, default=0.1, metavar='RATE',
                       help='LR decay rate (step / plateau), power for poly')

    group = parser.add_argument_group('Augmentation and regularization parameters')
    group.add_argument('--no-aug', action='store_true', default=False, help='disable all training augmentation')
    group.add_argument('--scale', type=float, nargs='+', default=[0.08, 1.0], metavar='PCT',
                       help='random resized crop scale range')
    group.add_argument('--ratio', type=float, nargs='+', default=[3. / 4., 4. / 3.], metavar='RATIO',
                       help='random resized crop aspect ratio range')
    group.add_argument('--hflip', type=float, default=0.5, help='horizontal flip probability')
    group.add_argument('--vflip', type=float, default=0., help='vertical flip probability')
    group.add_argument('--color-jitter', type=float, default=0.4, metavar='PCT', help='color jitter factor')
    group.add_argument('--aa', type=str, default=None, metavar='NAME',
                       help='AutoAugment / RandAugment policy, e.g. rand-m9-mstd0.5-inc1, original')
    group.add_argument('--aug-repeats', type=float, default=0,
                       help='repeated augmentation: each image this many times per epoch (e.g. 3; 0 = off)')
    group.add_argument('--reprob', type=float, default=0., metavar='PCT', help='random erase probability')
    group.add_argument('--remode', type=str, default='pixel', help='random erase mode')
    group.add_argument('--recount', type=int, default=1, help='random erase count')
    group.add_argument('--mixup', type=float, default=0.0, help='mixup alpha (> 0 enables)')
    group.add_argument('--cutmix', type=float, default=0.0, help='cutmix alpha (> 0 enables)')
    group.add_argument('--cutmix-minmax', type=float, nargs='+', default=None, help='cutmix min/max ratio')
    group.add_argument('--mixup-prob', type=float, default=1.0, help='probability of mixup or cutmix per batch')
    group.add_argument('--mixup-switch-prob', type=float, default=0.5, help='probability of cutmix over mixup')
    group.add_argument('--mixup-mode', type=str, default='batch', help="'batch', 'pair' or 'elem'")
    group.add_argument('--mixup-off-epoch', default=0, type=int, metavar='N', help='turn mixup off at this epoch')
    group.add_argument('--smoothing', type=float, default=0.1, help='label smoothing')
    group.add_argument('--bce-loss', action='store_true', default=False, help='binary cross-entropy loss')
    group.add_argument('--bce-target-thresh', type=float, default=None, help='BCE target binarisation threshold')
    group.add_argument('--train-interpolation', type=str, default='random', help='training interpolation')
    group.add_argument('--drop', type=float, default=0.0, metavar='PCT', help='dropout rate before the classifier')
    group.add_argument('--drop-path', type=float, default=None, metavar='PCT', help='drop path (stochastic depth)')

    group = parser.add_argument_group('Model exponential moving average parameters')
    group.add_argument('--model-ema', action='store_true', default=False, help='keep an EMA of the weights')
    group.add_argument('--model-ema-force-cpu', action='store_true', default=False,
                       help='keep the EMA on the CPU (not evaluated during training)')
    group.add_argument('--model-ema-decay', type=float, default=0.9998, help='EMA decay')
    group.add_argument('--model-ema-warmup', action='store_true', default=False, help='EMA decay warmup')

    group = parser.add_argument_group('Miscellaneous parameters')
    group.add_argument('--seed', type=int, default=42, metavar='S', help='random seed')
    group.add_argument('--log-interval', type=int, default=50, metavar='N', help='optimizer updates between logs')
    group.add_argument('--checkpoint-hist', type=int, default=3, metavar='N',
                       help='keep the N best checkpoint-<epoch>.pth files (besides last / best)')
    group.add_argument('-j', '--workers', type=int, default=4, metavar='N', help='data loading processes')
    group.add_argument('--pin-mem', action='store_true', default=False, help='pin CPU memory in the loader')
    group.add_argument('--output', default='', type=str, metavar='PATH',
                       help='output root (default: ./output/train)')
    group.add_argument('--experiment', default='', type=str, metavar='NAME',
                       help='experiment folder name (default: date-model-size)')
    group.add_argument('--eval-metric', default='top1', type=str, metavar='EVAL_METRIC',
                       help="metric for best checkpoint ('top1', 'top5' or 'loss')")
    return parser


def _has_dataset(args) -> bool:
    return bool(args.data or args.data_dir or args.dataset)


def parse_args(argv=None):
    """Parse flags and the optional yaml config. Returns (args, demo) where demo = no dataset was given."""
    args, _ = parse_args_with_config(build_parser(), argv)
    if _has_dataset(args):
        return args, False
    if not DEMO_CONFIG.is_file():
        raise UsageError(f'no dataset given and the demo recipe {DEMO_CONFIG} is missing: pass --data-dir DIR')
    # the demo recipe sits under the user's config and flags
    args, _ = parse_args_with_config(build_parser(), argv, base_configs=[str(DEMO_CONFIG)])
    return args, True


def resolve_lr(args, world_size: int) -> None:
    # timm's rule: with no --lr, scale --lr-base from --lr-base-size to the global batch
    if args.lr is not None:
        return
    global_batch = args.batch_size * world_size * args.grad_accum_steps
    ratio = global_batch / args.lr_base_size
    if not args.lr_base_scale:
        args.lr_base_scale = 'sqrt' if any(o in args.opt.lower() for o in ('ada', 'lamb')) else 'linear'
    if args.lr_base_scale == 'sqrt':
        ratio = ratio ** 0.5
    args.lr = args.lr_base * ratio
    _logger.info(f'learning rate {args.lr:.4g} = lr_base {args.lr_base:g} x {args.lr_base_scale} scaling of the '
                 f'global batch {global_batch} / {args.lr_base_size}')


def check_args(args, dist_info) -> None:
    if args.grad_accum_steps < 1:
        raise UsageError(f'--grad-accum-steps must be >= 1, got {args.grad_accum_steps}')
    if args.batch_size < 1:
        raise UsageError(f'--batch-size must be >= 1, got {args.batch_size}')
    if (args.mixup > 0 or args.cutmix > 0 or args.cutmix_minmax is not None) and args.batch_size % 2:
        raise UsageError(f'mixup / cutmix need an even --batch-size, got {args.batch_size}')
    if args.sync_bn and dist_info.device.type != 'cuda':
        raise UsageError('--sync-bn needs CUDA (PyTorch\'s SyncBatchNorm does not run on the CPU); '
                         'on CPU use --dist-bn reduce (the default) to average BatchNorm stats every epoch')
    if args.eval_metric not in ('top1', 'top5', 'loss'):
        raise UsageError(f"--eval-metric must be 'top1', 'top5' or 'loss', got {args.eval_metric!r}")


def main(argv=None):
    log_files = []
    try:
        return _main(argv, log_files)
    except UsageError as e:
        raise SystemExit(f'train.py: error: {e}')
    finally:
        for handler in log_files:
            remove_log_file(handler)


def _main(argv, log_files):
    run_start = time.time()
    args, demo = parse_args(argv)
    dist_info = init_device(args.device, args.dist_backend, args.dist_url)
    device, primary = dist_info.device, dist_info.primary
    setup_logging(primary)
    check_args(args, dist_info)
    if dist_info.distributed:
        _logger.info(f'distributed: {dist_info.world_size} processes, backend '
                     f'{torch.distributed.get_backend()}, device {device} on rank 0')

    if demo:
        args.data_dir = str(prepare_digits_folder())
        args.dataset, args.train_split, args.val_split = '', 'train', 'val'
        _logger.info(
            'Demo: no dataset was given, so this trains a small model on scikit-learn\'s bundled handwritten '
            f'digits (1,797 real 8x8 scans, 10 classes), written once as an ImageFolder tree under '
            f'{args.data_dir}, through the same pipeline as an ImageNet run (recipe {DEMO_CONFIG.name}). '
            'Pass --data-dir DIR to train on your own data.')
    data_dir = args.data_dir or args.data

    random_seed(args.seed, dist_info.rank)

    # ---------------------------------------------------------------- datasets
    dataset_train = create_image_dataset(
        args.dataset, root=data_dir, split=args.train_split, is_training=True, class_map=args.class_map,
        download=args.dataset_download, input_img_mode=args.input_img_mode, batch_size=args.batch_size,
        seed=args.seed, what='training set')
    dataset_eval = None
    if args.val_split:
        dataset_eval = create_image_dataset(
            args.dataset, root=data_dir, split=args.val_split, is_training=False, class_map=args.class_map,
            download=args.dataset_download, input_img_mode=args.input_img_mode, batch_size=args.batch_size,
            seed=args.seed, what='validation set')
    train_classes = dataset_class_names(dataset_train)
    if args.num_classes is None:
        if train_classes is None:
            raise UsageError('the training set does not list its classes: pass --num-classes N')
        args.num_classes = len(train_classes)
    hint = f' (--num-classes {args.num_classes}); pass --num-classes to match the data, or a --class-map'
    check_num_classes(dataset_train, args.num_classes, 'training set', hint)
    if dataset_eval is not None:
        check_num_classes(dataset_eval, args.num_classes, 'validation set', hint)

    resume_ckpt = None
    if args.resume:  # checked before anything is built
        resume_ckpt = load_checkpoint_file(args.resume)
        if not is_training_checkpoint(resume_ckpt) or 'optimizer' not in resume_ckpt:
            raise UsageError(f'--resume {args.resume} is not a training checkpoint of train.py (expected last.pth '
                             f'or checkpoint-<epoch>.pth of an experiment folder)')
        if resume_ckpt['arch'] != args.model:
            raise UsageError(f'--resume {args.resume} is a checkpoint of model {resume_ckpt["arch"]!r}, '
                             f'not --model {args.model!r}')

    # ---------------------------------------------------------------- model
    img_size = args.input_size[-2:] if args.input_size else args.img_size
    # models with a fixed input size (ours, ViTs) are built for --img-size; others just get resized inputs
    takes_img_size = timm.is_model(args.model) and timm.models.get_pretrained_cfg_value(args.model, 'fixed_input_size')
    create_kwargs = model_create_kwargs(
        num_classes=args.num_classes,
        in_chans=args.in_chans or (args.input_size[0] if args.input_size else None),
        img_size=img_size if takes_img_size else None,
        drop_rate=args.drop,
        drop_path_rate=args.drop_path,
        global_pool=args.gp,
        model_kwargs=args.model_kwargs,
    )
    model = create_model(args.model, pretrained=args.pretrained, pretrained_file=args.pretrained_path,
                         **create_kwargs)
    if args.initial_checkpoint:
        ckpt = load_checkpoint_file(args.initial_checkpoint)
        state_dict = ckpt['state_dict'] if is_training_checkpoint(ckpt) else ckpt
        load_model_weights(model, state_dict, f'--initial-checkpoint {args.initial_checkpoint}', args.model)
    num_params = sum(p.numel() for p in model.parameters())

    data_config = resolve_data_config(vars(args), model=model, verbose=False)
    if getattr(model, 'img_size', None) is not None and not args.input_size and not args.img_size:
        data_config['input_size'] = (data_config['input_size'][0], *model.img_size)  # built via --model-kwargs
    data_config = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data_config.items()}

    if args.grad_checkpointing:
        model.set_grad_checkpointing(enable=True)
    model.to(device=device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    if dist_info.distributed and args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)

    # ---------------------------------------------------------------- optimizer, AMP
    resolve_lr(args, dist_info.world_size)
    optimizer = create_optimizer_v2(model, **optimizer_kwargs(cfg=args))
    amp_autocast, loss_scaler, amp_dtype = suppress, None, None
    if args.amp:
        amp_dtype = getattr(torch, args.amp_dtype or ('float16' if device.type == 'cuda' else 'bfloat16'))
        amp_autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype)
        if amp_dtype == torch.float16:
            if device.type != 'cuda':
                raise UsageError('--amp-dtype float16 needs CUDA; on the CPU use bfloat16 (the default)')
            loss_scaler = NativeScaler(device=device.type)

    # ---------------------------------------------------------------- resume
    start_epoch, num_updates = 0, 0
    if resume_ckpt is not None:
        load_model_weights(unwrap_model(model), resume_ckpt['state_dict'], f'--resume {args.resume}', args.model)
        if not args.no_resume_opt and loss_scaler is not None and resume_ckpt.get('amp_scaler'):
            loss_scaler.load_state_dict(resume_ckpt['amp_scaler'])
        start_epoch = resume_ckpt['epoch'] + 1
        num_updates = resume_ckpt.get('num_updates', 0)

    # EMA: created after moving the model, before DDP / compile (as timm)
    model_ema = None
    if args.model_ema:
        model_ema = ModelEmaV3(
            model, decay=args.model_ema_decay, use_warmup=args.model_ema_warmup,
            device=torch.device('cpu') if args.model_ema_force_cpu else None)
        if resume_ckpt is not None and resume_ckpt.get('state_dict_ema') is not None:
            load_model_weights(model_ema.module, resume_ckpt['state_dict_ema'], f'--resume {args.resume} (EMA)',
                               args.model)

    if dist_info.distributed:
        model = wrap_ddp(model, dist_info)
    if args.torchcompile:
        model = torch.compile(model, backend=args.torchcompile, mode=args.torchcompile_mode)

    # ---------------------------------------------------------------- loaders, mixup, loss
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

    mixup_fn = None
    mixup_active = args.mixup > 0 or args.cutmix > 0. or args.cutmix_minmax is not None
    if mixup_active:
        mixup_fn = Mixup(
            mixup_alpha=args.mixup, cutmix_alpha=args.cutmix, cutmix_minmax=args.cutmix_minmax,
            prob=args.mixup_prob, switch_prob=args.mixup_switch_prob, mode=args.mixup_mode,
            label_smoothing=args.smoothing, num_classes=args.num_classes)
    if mixup_active:
        train_loss_fn = (BinaryCrossEntropy(target_threshold=args.bce_target_thresh) if args.bce_loss
                         else SoftTargetCrossEntropy())
    elif args.smoothing:
        train_loss_fn = (BinaryCrossEntropy(smoothing=args.smoothing, target_threshold=args.bce_target_thresh)
                         if args.bce_loss else LabelSmoothingCrossEntropy(smoothing=args.smoothing))
    else:
        train_loss_fn = nn.BCEWithLogitsLoss() if args.bce_loss else nn.CrossEntropyLoss()
    train_loss_fn = train_loss_fn.to(device=device)

    # ---------------------------------------------------------------- schedule
    updates_per_epoch = (len(loader_train) + args.grad_accum_steps - 1) // args.grad_accum_steps
    lr_scheduler, num_epochs = create_scheduler_v2(
        optimizer, **scheduler_kwargs(args, decreasing_metric=args.eval_metric == 'loss'),
        updates_per_epoch=updates_per_epoch)
    if resume_ckpt is not None and not args.no_resume_opt:
        # after the scheduler's constructor (which resets the param groups' LR): the saved optimizer state holds
        # the exact LR of the next update, the scheduler state the rest
        optimizer.load_state_dict(resume_ckpt['optimizer'])
        if resume_ckpt.get('scheduler'):
            lr_scheduler.load_state_dict(resume_ckpt['scheduler'])
    elif start_epoch > 0:
        if args.sched_on_updates:
            lr_scheduler.step_update(start_epoch * updates_per_epoch)
        else:
            lr_scheduler.step(start_epoch)

    # ---------------------------------------------------------------- outputs
    output_dir = None
    saver = None
    summary = None
    if primary:
        if args.resume and not args.output and not args.experiment:
            output_dir = Path(args.resume).resolve().parent  # continue in the resumed run's folder
        elif args.resume:
            output_dir = Path(get_outdir(args.output or './output/train', args.experiment or 'resumed')).resolve()
        else:
            exp_name = args.experiment or '-'.join(
                [datetime.now().strftime('%Y%m%d-%H%M%S')] + (['demo_digits'] if demo else [])
                + [args.model.replace('/', '_'), str(data_config['input_size'][-1])])
            output_dir = Path(get_outdir(args.output or './output/train', exp_name, inc=True)).resolve()
        log_files.append(add_log_file(output_dir / 'train.log'))
        with open(output_dir / 'args.yaml', 'w') as f:
            f.write(args_to_yaml(args))
        saver = CheckpointManager(output_dir, decreasing=args.eval_metric == 'loss', max_history=args.checkpoint_hist)
        summary = SummaryWriter(output_dir / 'summary.csv')
        if resume_ckpt is not None:
            saver.load_state_dict(resume_ckpt.get('checkpoint_history'))
            summary.truncate(before_epoch=start_epoch)

    global_batch = args.batch_size * dist_info.world_size * args.grad_accum_steps
    _logger.info(
        f'Model {args.model} ({num_params / 1e6:.3f} M params, {create_kwargs}) on {device}'
        f'{f" x {dist_info.world_size} processes" if dist_info.distributed else ""}; '
        f'input {data_config["input_size"]}, AMP {amp_dtype if args.amp else "off"}')
    _logger.info(
        f'Data {data_dir or args.dataset}: {len(dataset_train)} training images ({args.train_split}), '
        f'{len(dataset_eval) if dataset_eval is not None else 0} validation images ({args.val_split or "none"}), '
        f'{args.num_classes} classes')
    _logger.info(
        f'Training {num_epochs} epochs x {updates_per_epoch} updates, global batch {global_batch}, '
        f'{args.opt} lr {args.lr:.4g}, {args.sched} schedule'
        + (f'; resuming at epoch {start_epoch} from {args.resume}' if resume_ckpt is not None else ''))
    if primary:
        _logger.info(f'Outputs: {output_dir}')

    # restore every rank's RNG last, so nothing above (model init, loaders) shifts it
    if resume_ckpt is not None:
        rng_states = resume_ckpt.get('rng_states') or []
        if len(rng_states) == dist_info.world_size:
            set_rng_state(rng_states[dist_info.rank])
        else:
            _logger.warning(f'checkpoint has RNG states for {len(rng_states)} processes, this run has '
                            f'{dist_info.world_size}: continuing with fresh seeds (not bit-exact)')
    resume_ckpt = None  # free it

    # ---------------------------------------------------------------- train
    best = saver.best if saver is not None else None
    last_saved_epoch = start_epoch - 1 if start_epoch > 0 else None
    eval_metrics, ema_metrics, train_metrics = None, None, None
    peak_mem_gib = None
    train_start = time.time()
    try:
        for epoch in range(start_epoch, num_epochs):
            if sampler_train is not None:
                sampler_train.set_epoch(epoch)
            if mixup_fn is not None and args.mixup_off_epoch and epoch >= args.mixup_off_epoch:
                mixup_fn.mixup_enabled = False

            if device.type == 'cuda':
                torch.cuda.reset_peak_memory_stats(device)  # peak_mem_gib is this epoch's (training + eval)
            train_metrics, num_updates = train_one_epoch(
                epoch, model, loader_train, optimizer, train_loss_fn,
                num_updates=num_updates, total_epochs=num_epochs, lr_scheduler=lr_scheduler,
                amp_autocast=amp_autocast, loss_scaler=loss_scaler, model_ema=model_ema, mixup_fn=mixup_fn,
                grad_accum_steps=args.grad_accum_steps, clip_grad=args.clip_grad, clip_mode=args.clip_mode,
                channels_last=args.channels_last, distributed=dist_info.distributed,
                world_size=dist_info.world_size, log_interval=args.log_interval, primary=primary)

            if dist_info.distributed and args.dist_bn in ('broadcast', 'reduce'):
                distribute_bn(model, dist_info.world_size, args.dist_bn == 'reduce')

            metric = None
            with preserve_rng():  # evaluation must not shift the training's random stream
                if loader_eval is not None:
                    eval_metrics = evaluate(
                        model, loader_eval, amp_autocast=amp_autocast, channels_last=args.channels_last,
                        distributed=dist_info.distributed, log_interval=0, primary=primary)
                    metric = eval_metrics[args.eval_metric]
                    if model_ema is not None and not args.model_ema_force_cpu:
                        if dist_info.distributed and args.dist_bn in ('broadcast', 'reduce'):
                            distribute_bn(model_ema, dist_info.world_size, args.dist_bn == 'reduce')
                        ema_metrics = evaluate(
                            model_ema.module, loader_eval, amp_autocast=amp_autocast,
                            channels_last=args.channels_last, distributed=dist_info.distributed,
                            log_interval=0, primary=primary)
                        metric = ema_metrics[args.eval_metric]  # as timm: EMA selects the best checkpoint

            lr_scheduler.step(epoch + 1, metric)  # before saving: the checkpoint holds next epoch's LR
            rng_states = all_gather_objects(get_rng_state(), dist_info)

            if primary:
                row = {'epoch': epoch, 'lr': train_metrics['lr'], 'train_loss': train_metrics['loss']}
                if eval_metrics is not None:
                    row.update({f'eval_{k}': eval_metrics[k] for k in ('loss', 'top1', 'top5')})
                if ema_metrics is not None:
                    row.update({f'ema_eval_{k}': ema_metrics[k] for k in ('loss', 'top1', 'top5')})
                row.update(train_img_per_sec=train_metrics['img_per_sec'], epoch_seconds=train_metrics['seconds'])
                if device.type == 'cuda':
                    row['peak_mem_gib'] = torch.cuda.max_memory_allocated(device) / 2 ** 30
                    peak_mem_gib = max(peak_mem_gib or 0., row['peak_mem_gib'])
                summary.append(row)
                state = {
                    'version': CHECKPOINT_VERSION,
                    'epoch': epoch,
                    'num_updates': num_updates,
                    'arch': args.model,
                    'model_cfg': {'name': args.model, 'kwargs': create_kwargs},
                    'data_cfg': dict(data_config),
                    'state_dict': unwrap_model(model).state_dict(),
                    'state_dict_ema': model_ema.module.state_dict() if model_ema is not None else None,
                    'optimizer': optimizer.state_dict(),
                    'scheduler': lr_scheduler.state_dict(),
                    'amp_scaler': loss_scaler.state_dict() if loss_scaler is not None else None,
                    'rng_states': rng_states,
                    'metric': metric,
                    'eval_metrics': dict(eval_metrics) if eval_metrics is not None else None,
                    'ema_eval_metrics': dict(ema_metrics) if ema_metrics is not None else None,
                    'args': vars(args),
                }
                written = saver.save(state, epoch, metric)
                best, last_saved_epoch = saver.best, epoch
                msg = f'Epoch {epoch}/{num_epochs - 1}: train loss {train_metrics["loss"]:.4f}'
                if eval_metrics is not None:
                    msg += (f' | eval loss {eval_metrics["loss"]:.4f} top1 {eval_metrics["top1"]:.2f} '
                            f'top5 {eval_metrics["top5"]:.2f}')
                if ema_metrics is not None:
                    msg += f' | EMA top1 {ema_metrics["top1"]:.2f}'
                msg += f' | {train_metrics["img_per_sec"]:,.0f} img/s, {format_duration(train_metrics["seconds"])}'
                if 'peak_mem_gib' in row:
                    msg += f', peak {row["peak_mem_gib"]:.2f} GiB'
                msg += ' | saved last.pth' + (' + model_best.pth' if written['best'] else '')
                _logger.info(msg)
    except NonFiniteLossError as e:
        raise non_finite_exit(
            e, 'train.py', saver.last_path if saver is not None else None,
            f'epoch {last_saved_epoch}' if last_saved_epoch is not None else None,
            'Lower --lr, add --clip-grad or more --warmup-epochs', output_dir, primary)

    # ---------------------------------------------------------------- final outputs
    digest = state_dict_digest(unwrap_model(model))
    if model_ema is not None:
        digest += ' ema:' + state_dict_digest(model_ema.module)
    digests = all_gather_objects(digest, dist_info)
    if dist_info.distributed and len(set(digests)) != 1:
        _logger.error(f'weights differ across ranks: {digests}')
    demo_val = None
    if demo and loader_eval is not None:
        # every rank takes part (in distributed mode validate.py's evaluation is split over the ranks)
        best_path = Path(all_gather_objects(str(saver.best_path) if primary else '', dist_info)[0])
        val_argv = ['--checkpoint', str(best_path), '--data-dir', data_dir, '--split', args.val_split,
                    '--workers', str(args.workers), '--results-file', str(best_path.parent / 'validate_best.json')]
        if model_ema is not None and not args.model_ema_force_cpu:
            val_argv.append('--use-ema')  # the EMA weights' accuracy chose the best checkpoint
        _logger.info('Demo: validating the saved best checkpoint with validate.py:\n  python validate.py '
                     + ' '.join(val_argv))
        import validate as validate_script  # validate.py beside this file
        demo_val = validate_script.main(val_argv)
    if not primary:
        return None

    results = {
        'model': args.model,
        'model_kwargs': create_kwargs,
        'experiment_dir': str(output_dir),
        'device': str(device),
        'device_name': torch.cuda.get_device_name(device) if device.type == 'cuda' else None,
        'cuda_peak_mem_gib': peak_mem_gib,  # max over this process's epochs of torch.cuda.max_memory_allocated
        'torch_version': torch.__version__,
        'world_size': dist_info.world_size,
        'epochs': num_epochs,
        'global_batch': global_batch,
        'lr': args.lr,
        'final_epoch': num_epochs - 1,
        'train': dict(train_metrics) if train_metrics is not None else None,
        'eval': dict(eval_metrics) if eval_metrics is not None else None,
        'ema_eval': dict(ema_metrics) if ema_metrics is not None else None,
        'best': best,
        'eval_metric': args.eval_metric,
        'checkpoints': {'last': str(saver.last_path),
                        'best': str(saver.best_path) if saver.best_path.exists() else None},
        'weights_sha256_per_rank': digests,
        'ranks_agree': len(set(digests)) == 1,
        'train_seconds_this_process': time.time() - train_start,
        'demo_validation': demo_val,
        'command': ' '.join([os.path.basename(sys.argv[0])] + list(sys.argv[1:] if argv is None else argv)),
    }
    write_json(output_dir / 'results.json', results)
    plot_curves(output_dir / 'summary.csv', output_dir / 'curves.png',
                      title=f'{args.model} on {Path(data_dir).name if data_dir else args.dataset}')
    if eval_metrics is not None:
        msg = (f'Done in {format_duration(time.time() - train_start)}: final eval top1 {eval_metrics["top1"]:.2f} '
               f'top5 {eval_metrics["top5"]:.2f} loss {eval_metrics["loss"]:.4f}')
        if best:
            msg += f'; best {args.eval_metric} {best["metric"]:.4f} at epoch {best["epoch"]}'
        _logger.info(msg)
    names = [n for n in ('last.pth', 'model_best.pth', 'summary.csv', 'results.json', 'curves.png', 'args.yaml',
                         'train.log') if (output_dir / n).exists()]
    _logger.info(f'Outputs in {output_dir}: {", ".join(names)}')
    if demo_val is not None:
        _logger.info(
            f'Demo result: validation accuracy {demo_val["top1"]:.2f}% top-1 on {demo_val["samples"]} held-out '
            f'digit images (chance: 10%), checkpoint {saver.best_path}; '
            f'total time {format_duration(time.time() - run_start)}.')
    return results


if __name__ == '__main__':
    main()
