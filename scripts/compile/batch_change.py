""" torch.compile (default settings) across a batch-size change: ours against timm's model of the same architecture.

For each pair, a fresh ``torch.compile(model)`` runs batch 2 (first compile), then batch 3 (the partial last batch of
an epoch: a recompile with a dynamic batch), then batch 5 (no recompile expected); wall-clock seconds of each call,
outputs checked against eager. Models shrunk to 4 blocks so the compile fits a CPU (the graph repeats per block).

    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python scripts/compile/batch_change.py --out results/compile/cpu_batch_change.json

(inductor caches off: a cached graph would make a compile look instant).
"""
import argparse
import json
import time

import timm
import torch

import mlp_vision  # noqa: F401

def _timm_gmlp_s(**kwargs):  # timm's gmlp_s16_224 architecture with its depth given (its entrypoint fixes it)
    from timm.layers import GatedMlp
    from timm.models.mlp_mixer import MlpMixer, SpatialGatingBlock
    return MlpMixer(patch_size=16, embed_dim=256, mlp_ratio=6, block_layer=SpatialGatingBlock, mlp_layer=GatedMlp,
                    **kwargs)


def _timm_mixer_s16(**kwargs):  # timm's mixer_s16_224 architecture
    from timm.models.mlp_mixer import MlpMixer
    return MlpMixer(patch_size=16, embed_dim=512, **kwargs)


PAIRS = [  # (ours, timm's, kwargs for both)
    ('gmlp_s', _timm_gmlp_s, dict(num_blocks=4)),
    ('mixer_s16', _timm_mixer_s16, dict(num_blocks=4)),
]


def timed_compile(name, kwargs):
    torch._dynamo.reset()
    torch.manual_seed(0)
    if callable(name):
        model = name(num_classes=10, **kwargs).eval()
    else:
        model = timm.create_model(name, num_classes=10, **kwargs).eval()
    compiled = torch.compile(model)
    times = []
    with torch.no_grad():
        for n in (2, 3, 5):
            x = torch.randn(n, 3, 224, 224)
            t = time.perf_counter()
            y = compiled(x)
            times.append(round(time.perf_counter() - t, 1))
            torch.testing.assert_close(y, model(x), atol=1e-4, rtol=1e-4)
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--out', default='')
    p.add_argument('--threads', type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for ours, theirs, kwargs in PAIRS:
        for name in (ours, theirs):
            t = timed_compile(name, kwargs)
            label = name if isinstance(name, str) else 'timm ' + name.__name__.removeprefix('_timm_')
            rows.append({'model': label, 'kwargs': kwargs, 'seconds_batch2_3_5': t})
            print(f'{label:16s} batch 2: {t[0]:6.1f} s   batch 3: {t[1]:6.1f} s   batch 5: {t[2]:6.1f} s', flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({'date': time.strftime('%Y-%m-%d'), 'torch': torch.__version__, 'timm': timm.__version__,
                       'threads': args.threads, 'rows': rows}, f, indent=2)


if __name__ == '__main__':
    main()
