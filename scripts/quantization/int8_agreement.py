""" Top-1 agreement of int8 dynamic quantisation with float32 on real images (issue 12).

Usage (from the repository root, with a trained checkpoint of train.py):

    python scripts/quantization/int8_agreement.py --model smlpnet_t --img-size 64 --num-classes 10 \
        --checkpoint output/train/EXP/model_best.pth --data-dir ../shared/data/imagenette-mini --split val.tar

Quantises the model with ``torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)``, the
ordinary call, and evaluates both models on every image of the split with timm's eval transform: top-1 of each
against the labels, and the fraction of images where the two predict the same class.
"""
import argparse
import json
import time
import warnings

import timm
import torch
import torch.nn as nn
from timm.data import resolve_data_config

import mlp_vision  # noqa: F401  (registers the models)
from mlp_vision.weights import load_checkpoint_file, load_model_weights
from mlp_vision.image_data import create_eval_loader, create_image_dataset


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[1])
    p.add_argument('--model', required=True)
    p.add_argument('--img-size', type=int, required=True)
    p.add_argument('--num-classes', type=int, required=True)
    p.add_argument('--checkpoint', required=True)
    p.add_argument('--data-dir', required=True)
    p.add_argument('--split', default='val')
    p.add_argument('--batch-size', type=int, default=100)
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--out', default='')
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    model = timm.create_model(args.model, img_size=args.img_size, num_classes=args.num_classes).eval()
    ckpt = load_checkpoint_file(args.checkpoint)
    load_model_weights(model, ckpt.get('state_dict', ckpt), args.checkpoint, args.model)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # torch.ao.quantization's deprecation notice
        qmodel = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    n_quant = sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in qmodel.modules())

    data_config = resolve_data_config({'input_size': (3, args.img_size, args.img_size)}, model=model)
    dataset = create_image_dataset('', args.data_dir, args.split)
    loader = create_eval_loader(dataset, data_config, args.batch_size, torch.device('cpu'), num_workers=1)
    n = correct_f = correct_q = agree = 0
    t_f = t_q = 0.
    with torch.inference_mode():
        for x, y in loader:
            t = time.perf_counter()
            pf = model(x).argmax(1)
            t_f += time.perf_counter() - t
            t = time.perf_counter()
            pq = qmodel(x).argmax(1)
            t_q += time.perf_counter() - t
            n += len(y)
            correct_f += int((pf == y).sum())
            correct_q += int((pq == y).sum())
            agree += int((pf == pq).sum())
    res = {
        'model': args.model, 'img_size': args.img_size, 'checkpoint': args.checkpoint, 'images': n,
        'skipped_images': loader.skipped, 'linear_modules': n_linear, 'quantized_modules': n_quant,
        'top1_float32': 100. * correct_f / n, 'top1_int8': 100. * correct_q / n, 'top1_agreement': 100. * agree / n,
        'seconds_float32': round(t_f, 2), 'seconds_int8': round(t_q, 2), 'torch': torch.__version__,
        'date': time.strftime('%Y-%m-%d'),
    }
    print(json.dumps(res, indent=2))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(res, f, indent=2)


if __name__ == '__main__':
    main()
