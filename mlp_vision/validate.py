""" ``mlp-vision-validate`` / ``python -m mlp_vision.validate`` / ``python validate.py``: top-1 / top-5 accuracy,
loss and images/s of a model on a dataset (examples: README, "Training and validation"). Weights: ``--checkpoint``
of our train.py (model, kwargs and eval preprocessing rebuilt from it, ``--use-ema``), ``--checkpoint FILE --model
NAME`` for any other state dict, or ``--pretrained``. Labels: ``--class-map FILE``, else the class names a checkpoint
stores, else folder order (with a warning). ``torchrun`` splits the evaluation exactly over the ranks.
"""
import argparse
import csv
import io
import logging
import os

import torch

from mlp_vision.outputs import json_text, setup_logging, write_output_file
from mlp_vision.image_data import (
    check_class_names, check_dataset_package, check_image_args, check_num_classes, create_eval_loader,
    create_image_dataset)
from mlp_vision.arguments import THREADS_RANGE, ArgumentParser, DefaultsHelpFormatter, check_flag_ranges, set_threads
from mlp_vision.bounds import BOUND_RANGES, within_bounds
from mlp_vision.errors import UsageError, run_cli
from mlp_vision.weights import CROP_MODES, check_data_config
from mlp_vision import image_model
from mlp_vision.image_model import (
    CROP_PCT_RANGE, add_common_arguments, add_compile_arguments, add_dataset_arguments, add_device_arguments,
    add_input_arguments, check_activations, check_compile_backend, compile_model,
    create_model_for_eval, init_device, model_create_kwargs, resolve_model_data_config, setup_amp)

_logger = logging.getLogger('validate')


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(description='mlp_vision validation (timm pipeline)',
                            formatter_class=DefaultsHelpFormatter)
    add_dataset_arguments(parser)
    parser.add_argument('--split', metavar='NAME', default='validation', help='dataset split (folder / tar)')
    parser.add_argument('--model', '-m', metavar='NAME', help="model name (default: the training checkpoint's)")
    parser.add_argument('--pretrained', action='store_true', help="use the model's pretrained weights")
    parser.add_argument('--checkpoint', default='', metavar='PATH',
                        help='our training checkpoint, a timm train.py checkpoint, or a state dict for --model')
    add_common_arguments(parser)
    parser.add_argument('--use-ema', action='store_true', help="evaluate the checkpoint's EMA weights")
    parser.add_argument('--num-classes', type=int, metavar='N', help="label classes (default: the model's)")
    add_input_arguments(parser)
    parser.add_argument('--crop-mode', choices=CROP_MODES, help='how the eval crop is taken')
    parser.add_argument('-b', '--batch-size', default=256, type=int, metavar='N', help='batch size')
    add_device_arguments(parser, distributed=False)
    add_compile_arguments(parser)
    parser.add_argument('--log-interval', default=10, type=int, metavar='N', help='batches between progress logs')
    parser.add_argument('--results-file', default='', metavar='FILENAME',
                        help='write the results to this .json or .csv file (an earlier regular file is kept as '
                             'NAME-1; a FIFO, device or /dev/stdout is written as it is)')
    return parser


# the range of each numeric flag (check_range's bounds); --mean / --std are checked per channel by check_image_args
FLAG_RANGES = {'batch_size': dict(low=1), 'workers': dict(low=0), 'log_interval': dict(low=1),
               'num_classes': dict(low=1), 'img_size': dict(low=1), 'input_size': dict(low=1), 'in_chans': dict(low=1),
               'crop_pct': CROP_PCT_RANGE, 'threads': THREADS_RANGE, **BOUND_RANGES}


def check_args(args: argparse.Namespace) -> None:
    """Every flag value that cannot work, as one line, before a file is read or a model built."""
    check_flag_ranges(args, FLAG_RANGES)
    check_dataset_package(args.dataset)
    check_image_args(args, model_in_chans=None)  # again once the model is known
    check_compile_backend(args.torchcompile)
    if not args.checkpoint and not args.model:
        raise UsageError('nothing to validate: pass --checkpoint PATH (a training checkpoint knows its model) '
                         'or --model NAME [--pretrained]')
    if args.results_file and os.path.isdir(args.results_file):
        raise UsageError(f'--results-file {args.results_file} is a folder; expected a .json or .csv file path')


def _validation_dataset(args: argparse.Namespace, data_dir, model, info: dict):
    """(the validation set, how its labels were decided): by ``--class-map``, else the class names a training
    checkpoint stores, else the dataset's folder order (with a warning: nothing says the model was trained so)."""
    class_names = info.get('class_names')
    where = f' ({info["model_name"]} from {info["source"]})'
    create = dict(root=data_dir, split=args.split, is_training=False, download=args.dataset_download,
                  input_img_mode=args.input_img_mode, batch_size=args.batch_size, what='validation set')
    if args.class_map:
        if class_names:
            _logger.info(f'labels from --class-map {args.class_map}, not from the class names stored in the checkpoint')
        dataset = create_image_dataset(args.dataset, class_map=args.class_map, **create)
        labels = f'--class-map {args.class_map}'
    elif class_names:
        dataset = create_image_dataset(args.dataset, class_to_idx={n: i for i, n in enumerate(class_names)}, **create)
        check_class_names(dataset, class_names, 'validation set',
                          f'{where}; expected class folders named as the model\'s classes (a subset is fine), or '
                          f'pass --class-map FILE to say which folder is which label')
        labels = 'class names stored in the checkpoint'
    else:
        dataset = create_image_dataset(args.dataset, **create)
        if info['source'] != 'random init':
            _logger.warning(f'the weights ({info["source"]}) do not store the class names the model was trained on: '
                            f'labels are assumed to follow the folder order; pass --class-map FILE if they do not')
        labels = 'dataset class order (assumed)'
    check_num_classes(dataset, model.num_classes, 'validation set',
                      f'{where}; validate on data with the classes the model was trained for, or pass --class-map')
    return dataset, labels


def validate(args: argparse.Namespace) -> dict:
    """Run one validation; returns the results dict. Raises :class:`UsageError` for bad input."""
    check_args(args)
    threads = set_threads(args.threads)
    dist_info = init_device(args.device)
    device = dist_info.device
    setup_logging(dist_info.primary)
    _logger.info(threads)
    data_dir = args.data_dir or args.data

    # the weights decide the model (a training checkpoint knows its own); explicit flags override
    img_size = args.input_size[-2:] if args.input_size else args.img_size
    create_kwargs = model_create_kwargs(
        num_classes=args.num_classes, in_chans=args.in_chans or (args.input_size[0] if args.input_size else None),
        img_size=img_size, global_pool=args.gp, model_kwargs=args.model_kwargs)
    model, info = create_model_for_eval(
        args.model, checkpoint=args.checkpoint, pretrained=args.pretrained, use_ema=args.use_ema,
        create_kwargs=create_kwargs, trust_checkpoint=args.trust_checkpoint)
    model_name = info['model_name']
    num_params = sum(p.numel() for p in model.parameters())
    check_image_args(args, model_in_chans=getattr(model, 'in_chans', 3))

    dataset, labels = _validation_dataset(args, data_dir, model, info)

    # preprocessing: explicit flags, then the training checkpoint's eval preprocessing, then the model's config
    saved_cfg = info.get('data_cfg')
    if saved_cfg is not None:
        check_data_config(saved_cfg, f'checkpoint {args.checkpoint}: its data_cfg', getattr(model, 'in_chans', 3))
    data_config = resolve_model_data_config(args, model, saved_cfg or {})
    sizes_from = f"checkpoint {args.checkpoint}'s model_cfg / data_cfg" if info['checkpoint_kind'] else ''
    check_activations(model_name, info['create_kwargs'], data_config['input_size'], args.batch_size, training=False,
                      sizes_from=sizes_from)

    model.to(device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    model = compile_model(model, args)
    amp_autocast, _, amp_dtype = setup_amp(args.amp, args.amp_dtype, device)

    loader = create_eval_loader(dataset, data_config, args.batch_size, device, num_workers=args.workers,
                                distributed=dist_info.distributed, pin_memory=args.pin_mem)
    _logger.info(f'Validating {model_name} ({num_params / 1e6:.3f} M params, weights: {info["source"]}) on '
                 f'{len(dataset)} images of {data_dir or args.dataset} ({args.split}), input '
                 f'{data_config["input_size"]}, {device}{", AMP " + str(amp_dtype) if args.amp else ""}')
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    metrics = image_model.validate(model, loader, amp_autocast=amp_autocast, channels_last=args.channels_last,
                                   distributed=dist_info.distributed, log_interval=args.log_interval,
                                   primary=dist_info.primary)
    results = {
        'model': model_name, 'weights': info['source'], 'labels': labels, 'top1': round(metrics['top1'], 4),
        'top5': None if metrics['top5'] is None else round(metrics['top5'], 4),  # None: 5 classes or fewer
        'loss': round(metrics['loss'], 6), 'samples': metrics['samples'],
        'img_per_sec': round(metrics['img_per_sec'], 2), 'param_count_m': round(num_params / 1e6, 3),
        'img_size': data_config['input_size'][-1], 'crop_pct': data_config['crop_pct'],
        'interpolation': data_config['interpolation'], 'device': str(device),
        'amp': str(amp_dtype) if args.amp else None, 'channels_last': args.channels_last,
        'torchcompile': args.torchcompile,
    }
    if device.type == 'cuda':
        results['device_name'] = torch.cuda.get_device_name(device)
        results['cuda_peak_mem_gib'] = round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 3)
    top5 = f' Acc@5 {results["top5"]:.3f}' if results['top5'] is not None else ''
    _logger.info(f' * Acc@1 {results["top1"]:.3f}{top5} loss {results["loss"]:.4f} '
                 f'({results["samples"]} images, {results["img_per_sec"]:,.0f} img/s)')
    if args.results_file and dist_info.primary:  # JSON, or CSV by the extension; an earlier regular file is kept
        text = json_text(results)
        if args.results_file.endswith('.csv'):
            buf = io.StringIO()
            csv.writer(buf).writerows([list(results), list(results.values())])
            text = buf.getvalue()
        if (kept := write_output_file(args.results_file, text, keep=True)) is not None:
            _logger.info(f'the earlier {args.results_file} is kept as {kept}')
    return results


def main(argv=None, prog: str = 'validate.py') -> dict:
    """Validate; returns the results dict. Errors: one line starting with ``prog`` (``run_cli``)."""
    return run_cli(prog, lambda a: within_bounds(validate, build_parser().parse_args(a)), argv)


if __name__ == '__main__':
    main(prog='python -m mlp_vision.validate')
