"""A fresh probe of issue 44's table: each case as a user runs it, in a temp folder.

usage: PYTHONPATH=CHECKOUT python probe44.py CHECKOUT OUT.md

For each case: the command, exit status, how many lines stderr ended with after the last blank line / traceback
marker, its last line, and a post-condition (e.g. the device is still a device). A case "holds" when it exits as
expected, prints no traceback (without --debug), and its post-condition holds.
"""
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHECKOUT = Path(sys.argv[1]).resolve()
OUT = Path(sys.argv[2])
PY = sys.executable
ENV = dict(os.environ, PYTHONPATH=str(CHECKOUT), OMP_NUM_THREADS='1')
TMP = Path(tempfile.mkdtemp(prefix='probe44-'))
rows = []


def run(argv, timeout=900, stdin=None):
    t = time.time()
    try:
        p = subprocess.run(argv, cwd=TMP, env=ENV, capture_output=True, text=True, timeout=timeout, stdin=stdin,
                           errors='replace')
        return p.returncode, p.stdout, p.stderr, time.time() - t
    except subprocess.TimeoutExpired:
        return 'timeout', '', '', time.time() - t


def case(family, name, argv, expect_rc=(2,), post=None, timeout=900):
    rc, out, err, wall = run(argv, timeout)
    tb = 'Traceback (most recent call last)' in err
    lines = [l for l in err.strip().splitlines() if l.strip() and 'WARNING' not in l and 'INFO' not in l]
    last = lines[-1][:220] if lines else (out.strip().splitlines() or [''])[-1][:220]
    ok_post = True if post is None else bool(post())
    holds = rc in expect_rc and not tb and ok_post
    rows.append((family, name, rc, round(wall, 1), tb, ok_post, holds, last))
    print(f'{"OK " if holds else "BAD"} [{family}] {name}: rc={rc} tb={tb} post={ok_post} {last}', flush=True)


def images(root):
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, n in (('train', 8), ('val', 4)):
        for c, colour in enumerate(((200, 40, 40), (40, 40, 200))):
            folder = root / split / f'class{c}'
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                pixels = np.clip(rng.normal(colour, 40, size=(16, 16, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f'{i}.png')
    return root


def main():
    data = images(TMP / 'data')
    tiny = ['--model', 'smlpnet_t', '--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', '--img-size', '32',
            '-b', '4', '--threads', '1']
    train = [PY, '-m', 'mlp_vision.train', str(data)]
    validate = [PY, '-m', 'mlp_vision.validate', str(data / 'val')]
    # a finished tiny run: its pretrained/ is the local-dir folder the cases damage
    rc, out, err, _ = run(train + tiny + ['--epochs', '1', '--output', str(TMP / 'runs'), '--experiment', 'good'])
    assert rc == 0, (rc, out[-2000:], err[-2000:])
    good = TMP / 'runs' / 'good'
    pre = good / 'pretrained'

    # write outside: device / FIFO / link as an output path
    dev = TMP / 'fakenull'
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    fifo = TMP / 'fifo'
    os.mkfifo(fifo)
    link = TMP / 'stdout-link'
    link.symlink_to('/proc/self/fd/1')
    for label, path, check in (('char device', dev, lambda: stat.S_ISCHR(os.lstat(dev).st_mode)),
                               ('link to /proc/self/fd/1', link, lambda: link.is_symlink())):
        case('write outside', f'validate --results-file {label}',
             validate + ['--model', f'local-dir:{pre}', '--pretrained', '--results-file', str(path)],
             expect_rc=(0, 2), post=lambda: check() and not Path(str(path) + '-1').exists())
        case('write outside', f'complexity --output {label}',
             [PY, '-m', 'mlp_vision.complexity', '--models', 'smlpnet_t', '--output', str(path)],
             expect_rc=(0, 2), post=lambda: check() and not Path(str(path) + '-1').exists(), timeout=600)
    reader = subprocess.Popen(['cat', str(fifo)], stdout=subprocess.DEVNULL)  # a FIFO is written when read
    case('data loss', 'validate --results-file FIFO (a reader on it)',
         validate + ['--model', f'local-dir:{pre}', '--pretrained', '--results-file', str(fifo)],
         expect_rc=(0,), post=lambda: stat.S_ISFIFO(os.lstat(fifo).st_mode), timeout=300)
    reader.wait(timeout=60)

    # data loss: user files in pretrained/ on an in-place resume
    (pre / 'README.md').write_text('my model card')
    case('data loss', 'train --resume in place keeps RUN/pretrained/README.md',
         train + tiny + ['--epochs', '2', '--resume', str(good / 'last.pth')], expect_rc=(0,),
         post=lambda: (pre / 'README.md').exists() and (pre / 'README.md').read_text() == 'my model card')

    # silent wrong: local-dir folders
    from safetensors.torch import load_file, save_file
    import shutil
    import torch

    def folder(name, config=None, weights=None, raw=None):
        f = TMP / name
        shutil.copytree(pre, f)
        if config:
            cfg = json.loads((f / 'config.json').read_text()); config(cfg); (f / 'config.json').write_text(json.dumps(cfg))
        if weights:
            sd = load_file(str(f / 'model.safetensors')); weights(sd); save_file(sd, str(f / 'model.safetensors'))
        if raw is not None:
            (f / 'model.safetensors').write_bytes(raw)
        return f

    def nan(sd): sd['stem.weight'] = torch.full_like(sd['stem.weight'], float('nan'))
    def integer(sd): sd['stem.weight'] = sd['stem.weight'].to(torch.int32)
    def nostem(sd): del sd['stem.weight']
    def cfg_set(key, value):
        def f(cfg):
            (cfg['pretrained_cfg'] if key in cfg.get('pretrained_cfg', {}) or key in ('mean', 'std', 'crop_pct', 'interpolation') else cfg)[key] = value
        return f
    def notstrict(cfg): cfg.setdefault('model_args', {})['pretrained_strict'] = False
    bad = {
        'NaN weights': folder('nan', weights=nan),
        'integer weights': folder('int', weights=integer),
        'no stem, pretrained_strict false': folder('nostem', config=notstrict, weights=nostem),
        'mean NaN': folder('meannan', config=cfg_set('mean', [float('nan')] * 3)),
        'std 0': folder('std0', config=cfg_set('std', [0, 0, 0])),
        'architecture 5': folder('arch5', config=cfg_set('architecture', 5)),
        'mean "abc"': folder('meanabc', config=cfg_set('mean', 'abc')),
        'crop_pct -5': folder('crop', config=cfg_set('crop_pct', -5)),
        'interpolation evil': folder('interp', config=cfg_set('interpolation', 'evil')),
        'truncated safetensors': folder('trunc', raw=(pre / 'model.safetensors').read_bytes()[:100]),
        'empty safetensors': folder('empty', raw=b''),
        'absurd header': folder('absurd', raw=(2 ** 62).to_bytes(8, 'little') + b'{}'),
    }
    for label, f in bad.items():
        family = 'traceback' if label in ('architecture 5', 'mean "abc"', 'crop_pct -5', 'interpolation evil',
                                          'truncated safetensors', 'empty safetensors', 'absurd header') else 'silent wrong'
        case(family, f'validate local-dir: {label}', validate + ['--model', f'local-dir:{f}', '--pretrained'])
        case(family, f'train --pretrained local-dir: {label}',
             train + ['--model', f'local-dir:{f}', '--pretrained', '--epochs', '1', '--img-size', '32', '-b', '4',
                      '--output', str(TMP / 'r'), '--threads', '1'])
        case(family, f'benchmark local-dir: {label}',
             [PY, '-m', 'mlp_vision.benchmark', '--model', f'local-dir:{f}', '--img-size', '32',
              '-b', '2', '--iters', '1', '--warmup', '1', '--no-ceiling', '--threads', '1'], expect_rc=(0, 2),
             timeout=300)
        case(family, f'timm.create_model local-dir: {label}',
             [PY, '-c', 'import sys, timm, mlp_vision\nfrom mlp_vision.errors import UsageError\ntry:\n'
                        f' timm.create_model("local-dir:{f}", pretrained=True)\n'
                        'except UsageError as e:\n print(e, file=sys.stderr); sys.exit(2)'])
    case('silent wrong', 'timm.create_model(checkpoint_path=NaN .pth)',
         [PY, '-c', 'import sys, torch, timm, mlp_vision\nfrom mlp_vision.errors import UsageError\n'
                    'from safetensors.torch import load_file\n'
                    f'sd = load_file("{bad["NaN weights"]}/model.safetensors"); torch.save(sd, "nan.pth")\n'
                    'try:\n timm.create_model("smlpnet_t", embed_dim=8, depths=(1,1,1,1), img_size=32, num_classes=2, '
                    'checkpoint_path="nan.pth")\nexcept UsageError as e:\n print(e, file=sys.stderr); sys.exit(2)'])
    (data / 'val_renamed').mkdir()
    shutil.copytree(data / 'val' / 'class0', data / 'val_renamed' / 'other0')
    shutil.copytree(data / 'val' / 'class1', data / 'val_renamed' / 'other1')
    case('silent wrong', 'validate local-dir: on classes named otherwise',
         [PY, '-m', 'mlp_vision.validate', str(data / 'val_renamed'), '--model', f'local-dir:{pre}', '--pretrained'])
    # silent wrong: flags
    case('silent wrong', 'train --warmup-epochs 5 --epochs 2', train + tiny + ['--epochs', '2', '--warmup-epochs', '5',
                                                                              '--output', str(TMP / 'r')], expect_rc=(0, 2))
    case('silent wrong', 'train --min-lr 1 --lr 0.1', train + tiny + ['--epochs', '1', '--min-lr', '1', '--lr', '0.1',
                                                                       '--output', str(TMP / 'r')])
    for n in ('0', '5'):
        case('silent wrong', f'train --model-kwargs num_classes={n} on 2 classes',
             train + ['--model', 'smlpnet_t', '--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', f'num_classes={n}',
                      '--img-size', '32', '-b', '4', '--threads', '1', '--epochs', '1', '--output', str(TMP / 'r')])
    # hang
    case('hang', 'train --model-kwargs depths=(100000,1,1,1)',
         train + ['--model', 'smlpnet_t', '--model-kwargs', 'embed_dim=8', 'depths=(100000,1,1,1)', '--epochs', '1'],
         timeout=120)
    deep = folder('deep', config=lambda cfg: cfg.setdefault('model_args', {}).update(depths=[100000, 1, 1, 1]))
    case('hang', 'benchmark local-dir: config depths 100000',
         [PY, '-m', 'mlp_vision.benchmark', '--model', f'local-dir:{deep}', '--iters', '1'], timeout=120)
    case('hang', 'timm.create_model local-dir: config depths 100000',
         [PY, '-c', 'import sys, timm, mlp_vision\nfrom mlp_vision.errors import UsageError\ntry:\n'
                    f' timm.create_model("local-dir:{deep}")\nexcept (UsageError, ValueError) as e:\n'
                    ' print(e, file=sys.stderr); sys.exit(2)'], timeout=120)
    # traceback / misleading: flags
    for label, argv in (
            ('--max-activation-gib 1e300', train + tiny + ['--max-activation-gib', '1e300']),
            ('--max-params 0.5', train + tiny + ['--max-params', '0.5']),
            ('--model-kwargs embed_dim (no =)', train + ['--model', 'smlpnet_t', '--model-kwargs', 'embed_dim']),
            ('--dataset hfds/x without datasets', train + ['--dataset', 'hfds/x']),
            ('validate --crop-pct 100', validate + ['--model', f'local-dir:{pre}', '--pretrained', '--crop-pct', '100']),
            ('non-UTF-8 --experiment', train + tiny + ['--epochs', '1', '--output', str(TMP / 'r'),
                                                      '--experiment', os.fsdecode(b'run\xff')]),
            ('--results-file read-only dir', validate + ['--model', f'local-dir:{pre}', '--pretrained',
                                                          '--results-file', '/proc/results.json']),
            ('validate a text checkpoint', None),
    ):
        if argv is not None:
            case('traceback/misleading', label, argv)
    case('misleading', 'benchmark --compare two families',
         [PY, '-m', 'mlp_vision.benchmark', '--compare', f'local-dir:{bad["truncated safetensors"]}', 'gmlp_ti',
          '--img-size', '32', '-b', '2', '--iters', '1', '--warmup', '1', '--no-ceiling', '--threads', '1'],
         expect_rc=(0, 2))
    # text
    corpus = TMP / 'corpus.txt'
    corpus.write_text('\n'.join(f'the movie {i} was good and the film was bad .' for i in range(200)))
    text = [PY, '-m', 'mlp_vision.train_text', '--train-file', str(corpus), '--model', 'gmlp_base', '--tokenizer',
            'char', '--steps', '2', '--output', str(TMP / 'text'), '--threads', '1']
    case('traceback', 'train_text --tokenizer-from /dev/zero', text + ['--tokenizer-from', '/dev/zero'], timeout=120)

    with open(OUT, 'w') as f:
        f.write(f'# Probe of issue 44\'s table ({time.strftime("%Y-%m-%d %H:%M")} UTC), checkout {CHECKOUT}\n\n')
        f.write('| family | case | exit | s | traceback | post-condition | holds | last line |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n')
        for r in rows:
            f.write('| ' + ' | '.join(str(x).replace('|', '/') for x in r) + ' |\n')
        f.write(f'\n{sum(r[6] for r in rows)} of {len(rows)} hold.\n')
    print(f'{sum(r[6] for r in rows)} of {len(rows)} hold; {OUT}')


if __name__ == '__main__':
    main()
