""" mlp_vision training command: timm's ImageNet training pipeline for the registered models (and any timm model).

Run as ``mlp-vision-train`` or ``python -m mlp_vision.train`` (installed package), or ``python train.py`` in a
checkout. Flags follow timm's train.py; ``-c/--config`` reads a yaml file of flag values, or a recipe of
``configs/`` by name (``-c smlpnet_t``); explicit flags win. With no dataset it trains the demo on scikit-learn's
handwritten digits. Usage, outputs and resume (bit-identical on CPU, one process): README, "Training and
validation". SIGINT / SIGTERM stop the run at the next batch with one line naming the last checkpoint. Files load
without running code from them unless ``--trust-checkpoint``. Bad input ends with one line and exit status 2
(``--debug``: the traceback).
"""
import argparse
import logging
from pathlib import Path
from typing import Any, Dict, Mapping

import torch
from timm.data import create_transform
from timm.optim import list_optimizers
from timm.utils import ParseKwargs

from mlp_vision.training.run.config import SEED_MAX, check_flag_ranges, find_recipe
from mlp_vision.training.data import INTERPOLATIONS, check_image_args
from mlp_vision.training.run.distributed import all_gather_objects, init_device
from mlp_vision.training.run.driver import drive
from mlp_vision.training.tasks.image_classification import (
    DEFAULT_EPOCHS, DEMO_RECIPE, ImageClassification, uses_mixup)
from mlp_vision.arguments import ArgumentParser, DefaultsHelpFormatter
from mlp_vision.bounds import size_bounds
from mlp_vision.errors import UsageError, run_cli
from mlp_vision.training.run.log import setup_logging
from mlp_vision.training.tasks.image_model import ALLOW_MISSING_FLAG
from mlp_vision.training.run.compile import add_compile_arguments, check_compile_backend
from mlp_vision.training.run.training_run import TrainingRun, add_device_arguments, add_run_arguments, parse_run_args
from mlp_vision.threads import set_run_threads
from mlp_vision.validate import add_dataset_arguments, add_input_arguments, main as validate_main

_logger = logging.getLogger('train')

PROG = 'train.py'  # the command's name in messages (the console script and ``python -m`` pass their own)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        description='mlp_vision training (timm pipeline). With no dataset argument: the handwritten-digits demo.',
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument('-c', '--config', default='', type=str, metavar='FILE|RECIPE',
                        help='yaml file of flag values (keys = flag names), or the name of a recipe of configs/ '
                             '(shipped with the package), e.g. smlpnet_t; explicit flags override it')
    _add_data_and_model_args(parser)
    _add_device_and_optimizer_args(parser)
    _add_regularization_and_misc_args(parser)
    return parser


def _add_data_and_model_args(parser) -> None:
    group = parser.add_argument_group('Dataset parameters')
    add_dataset_arguments(group)
    group.add_argument('--train-split', metavar='NAME', default='train', help='dataset train split (folder / tar)')
    group.add_argument('--val-split', metavar='NAME|FRACTION', default='validation',
                       help="validation split: a split name (folder / tar; an error when the data has none), a "
                            "fraction 0 < f < 1 of the training images held out (class-stratified, seeded by "
                            "--seed), or '' for no evaluation")
    group = parser.add_argument_group('Model parameters')
    group.add_argument('--model', default='smlpnet_t', type=str, metavar='MODEL', help='name of model to train')
    group.add_argument('--pretrained', action='store_true', default=False,
                       help="start with the model's pretrained weights")
    group.add_argument('--pretrained-path', default=None, type=str, metavar='PATH',
                       help="start from a local weights file, loaded through the model's checkpoint filter "
                            "(official / timm layouts; classifier dropped if --num-classes differs)")
    group.add_argument('--initial-checkpoint', default='', type=str, metavar='PATH',
                       help='load these weights (a train.py checkpoint or a state dict of this exact model) first')
    add_run_arguments(group, 'continue the run of this checkpoint (usually EXP/last.pth) in its folder, with its '
                             'saved settings; flags given here override them')
    group.add_argument('--no-resume-opt', action='store_true', default=False,
                       help='with --resume: load weights and epoch only, not optimizer / scaler / scheduler')
    group.add_argument(ALLOW_MISSING_FLAG, action='store_true', default=False,
                       help='--pretrained-path: let model weights missing from the file keep their random init '
                            '(otherwise an error; a classifier for another class count is always re-initialised)')
    group.add_argument('--num-classes', type=int, default=None, metavar='N',
                       help='number of label classes (default: the training set\'s)')
    add_input_arguments(group)
    group.add_argument('-b', '--batch-size', type=int, default=128, metavar='N', help='batch size per process')
    group.add_argument('-vb', '--validation-batch-size', type=int, default=None, metavar='N',
                       help='validation batch size (default: --batch-size)')
    group.add_argument('--grad-accum-steps', type=int, default=1, metavar='N',
                       help='accumulate gradients over N batches per optimizer step')
    group.add_argument('--grad-checkpointing', action='store_true', default=False,
                       help='activation checkpointing through the model')
    add_compile_arguments(group)


def _add_device_and_optimizer_args(parser) -> None:
    group = parser.add_argument_group('Device and distributed')
    add_device_arguments(group)
    group.add_argument('--sync-bn', action='store_true', default=False, help='SyncBatchNorm (CUDA, distributed)')
    group.add_argument('--dist-bn', type=str, default='reduce', choices=('reduce', 'broadcast', ''),
                       help='after each epoch, make BatchNorm stats equal on all ranks (average or rank 0)')
    group = parser.add_argument_group('Optimizer parameters')
    group.add_argument('--opt', default='sgd', type=str, metavar='OPTIMIZER', help='optimizer (timm names)')
    group.add_argument('--opt-eps', default=None, type=float, metavar='EPSILON', help='optimizer epsilon')
    group.add_argument('--opt-betas', default=None, type=float, nargs='+', metavar='BETA', help='optimizer betas')
    group.add_argument('--momentum', type=float, default=0.9, metavar='M', help='optimizer momentum')
    group.add_argument('--weight-decay', type=float, default=2e-5, help='weight decay')
    group.add_argument('--clip-grad', type=float, default=None, metavar='NORM', help='gradient clipping (off if unset)')
    group.add_argument('--clip-mode', type=str, default='norm', choices=('norm', 'value', 'agc'),
                       help='what --clip-grad bounds')
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
    group.add_argument('--lr-base-scale', type=str, default='', choices=('', 'linear', 'sqrt'),
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
    group.add_argument('--epochs', type=int, default=DEFAULT_EPOCHS, metavar='N', help='number of epochs to train')
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


def _add_regularization_and_misc_args(parser) -> None:
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
    group.add_argument('--remode', type=str, default='pixel', choices=('pixel', 'rand', 'const'),
                       help='random erase mode')
    group.add_argument('--recount', type=int, default=1, help='random erase count')
    group.add_argument('--mixup', type=float, default=0.0, help='mixup alpha (> 0 enables)')
    group.add_argument('--cutmix', type=float, default=0.0, help='cutmix alpha (> 0 enables)')
    group.add_argument('--cutmix-minmax', type=float, nargs='+', default=None, help='cutmix min/max ratio')
    group.add_argument('--mixup-prob', type=float, default=1.0, help='probability of mixup or cutmix per batch')
    group.add_argument('--mixup-switch-prob', type=float, default=0.5, help='probability of cutmix over mixup')
    group.add_argument('--mixup-mode', type=str, default='batch', choices=('batch', 'pair', 'elem'),
                       help='mix per batch, per pair or per element')
    group.add_argument('--mixup-off-epoch', default=0, type=int, metavar='N', help='turn mixup off at this epoch')
    group.add_argument('--smoothing', type=float, default=0.1, help='label smoothing')
    group.add_argument('--bce-loss', action='store_true', default=False, help='binary cross-entropy loss')
    group.add_argument('--bce-target-thresh', type=float, default=None, help='BCE target binarisation threshold')
    group.add_argument('--train-interpolation', type=str, default='random', choices=INTERPOLATIONS[1:] + ('random',),
                       help='training interpolation')
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
    group.add_argument('--output', default='', type=str, metavar='PATH',
                       help='output root (default: ./output/train)')
    group.add_argument('--experiment', default='', type=str, metavar='NAME',
                       help='experiment folder name (default: date-model-size)')
    group.add_argument('--eval-metric', default='top1', type=str, choices=('top1', 'top5', 'loss'),
                       help='metric for best checkpoint')


def _has_dataset(settings: Mapping[str, Any]) -> bool:  # settings: arguments by destination
    return bool(settings.get('data') or settings.get('data_dir') or settings.get('dataset'))


def parse_args(argv):
    """(args, demo = no dataset given, resume checkpoint) from the flags, the ``-c`` yaml and a resumed run's
    saved settings; settings that name no dataset have the demo recipe as their base, under the user's -c and
    flags."""
    args, resume_ckpt = parse_run_args(
        build_parser(), argv, kind='image', recipes=True,
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
    'clip_grad': _NON_NEGATIVE, 'layer_decay': dict(low=0, high=1, low_open=True),
    'smoothing': _BELOW_ONE, 'drop': _BELOW_ONE, 'drop_path': _BELOW_ONE, 'reprob': _BELOW_ONE,
    'hflip': _UNIT, 'vflip': _UNIT, 'color_jitter': _NON_NEGATIVE, 'aug_repeats': _NON_NEGATIVE,
    'recount': _AT_LEAST_ONE, 'scale': dict(low=0, high=1, low_open=True), 'ratio': _POSITIVE,
    'mixup': _NON_NEGATIVE, 'cutmix': _NON_NEGATIVE, 'cutmix_minmax': dict(low=0, high=1, low_open=True),
    'mixup_prob': _UNIT, 'mixup_switch_prob': _UNIT, 'mixup_off_epoch': _NON_NEGATIVE,
    'bce_target_thresh': _UNIT, 'model_ema_decay': _BELOW_ONE, 'seed': dict(low=0, high=SEED_MAX),
    'num_classes': _AT_LEAST_ONE, 'img_size': _AT_LEAST_ONE, 'input_size': _AT_LEAST_ONE,
    'in_chans': _AT_LEAST_ONE,
}
# flags of two values (low, high)
_PAIRS = ('scale', 'ratio', 'cutmix_minmax', 'lr_noise')


def check_args(args, dist_info) -> None:
    """Every flag value that cannot work, as one clear message (before anything is built)."""
    check_flag_ranges(args, FLAG_RANGES)
    for dest in _PAIRS:
        value = getattr(args, dest)
        flag = '--' + dest.replace('_', '-')
        if value is not None and dest != 'lr_noise' and len(value) != 2:
            raise UsageError(f'{flag} takes two values (low high), got {len(value)}')
        if value is not None and len(value) == 2 and value[0] > value[1]:
            raise UsageError(f'{flag} takes low then high, got {value[0]:g} > {value[1]:g}')
    check_image_args(args)
    if args.opt.lower().split('_')[-1] not in list_optimizers():
        raise UsageError(f'--opt {args.opt!r} is not an optimizer timm knows (e.g. sgd, momentum, adamw, lamb; '
                         f'all: timm.optim.list_optimizers())')
    if args.aa:
        try:  # timm's parser of the policy string is the one that will read it
            create_transform(32, is_training=True, auto_augment=args.aa)
        except (AssertionError, ValueError, KeyError, IndexError) as e:
            raise UsageError(f'--aa {args.aa!r} is not an augmentation policy timm reads (e.g. '
                             f'rand-m9-mstd0.5-inc1, augmix-m5-w4-d2, original, v0): {e}') from None
    check_compile_backend(args.torchcompile)
    if uses_mixup(args) and args.batch_size % 2:
        raise UsageError(f'mixup / cutmix need an even --batch-size, got {args.batch_size}')
    if args.sync_bn and dist_info.device.type != 'cuda':
        raise UsageError('--sync-bn needs CUDA (PyTorch\'s SyncBatchNorm does not run on the CPU); '
                         'on CPU use --dist-bn reduce (the default) to average BatchNorm stats every epoch')


def main(argv=None, prog: str = PROG):
    """Train; returns the results dict on rank 0 (None on other ranks). Errors: one line starting with ``prog``,
    see ``run_cli``."""
    return run_cli(prog, lambda a: _main(a, prog), argv)


def _main(argv, prog):
    args, demo, resume_ckpt = parse_args(argv)
    dist_info = init_device(args.device, args.dist_backend, args.dist_url)
    setup_logging(dist_info.primary)
    check_args(args, dist_info)
    _logger.info(set_run_threads(args.threads, resume_ckpt, args.workers))
    run = TrainingRun(args, dist_info, resume_ckpt, kind='image', key='epoch', prog=prog,
                      decreasing=args.eval_metric == 'loss', max_history=args.checkpoint_hist)
    with run, size_bounds(args):
        return drive(run, ImageClassification(args, run, demo, ' '.join([prog] + list(argv)),
                                              validate_demo=_validate_demo))


def _validate_demo(run: TrainingRun, job: ImageClassification) -> Dict[str, Any]:
    """The demo's closing validation of its best checkpoint with the validation command (every rank takes part;
    the evaluation is split over them)."""
    args, dist_info = job.args, run.dist_info
    best_path = Path(all_gather_objects(str(run.saver.best_path) if dist_info.primary else '', dist_info)[0])
    val_argv = ['--checkpoint', str(best_path), '--data-dir', job.data_dir, '--split', args.val_split,
                '--workers', str(args.workers), '--results-file', str(best_path.parent / 'validate_best.json'),
                '--threads', str(torch.get_num_threads())]  # the training's count: the load now includes this run
    if job.opt.model_ema is not None and not args.model_ema_force_cpu:
        val_argv.append('--use-ema')  # the EMA weights' accuracy chose the best checkpoint
    _logger.info('Demo: validating the saved best checkpoint with the validation command:\n'
                 '  python -m mlp_vision.validate ' + ' '.join(val_argv))
    return validate_main(val_argv)


if __name__ == '__main__':
    main(prog='python -m mlp_vision.train')
