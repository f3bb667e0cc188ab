""" The demo dataset: scikit-learn's bundled handwritten digits written once as an ImageFolder tree.

``python train.py`` with no dataset trains on it, so the demo needs no download; the tree is read by the same
image-folder reader as any other dataset.
"""
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

from mlp_vision.errors import UsageError

__all__ = ['default_cache_dir', 'prepare_digits_folder']

DIGITS_CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """``$MLP_VISION_CACHE``, else ``$XDG_CACHE_HOME/mlp_vision``, else ``~/.cache/mlp_vision``."""
    if os.environ.get('MLP_VISION_CACHE'):
        return Path(os.environ['MLP_VISION_CACHE']).expanduser()
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / 'mlp_vision'


def prepare_digits_folder(
        root: Optional[os.PathLike] = None,
        size: int = 32,
        val_every: int = 5,
        max_per_class: Optional[int] = None,
) -> Path:
    """Write scikit-learn's handwritten digits as an ImageFolder tree, once; return its root.

    ``root/{train,val}/<digit>/<index>.png``: grayscale PNGs upscaled (bicubic) from the 8x8 scans (values 0..16)
    to ``size`` x ``size``. Within each class every ``val_every``-th sample goes to val (5: 1,437 train / 360 val
    images); ``max_per_class`` keeps only the first samples of each class (small test sets). Built in a temporary
    folder beside ``root`` and renamed into place, so a folder that exists is complete, and concurrent callers
    (DDP ranks, parallel tests) do not see each other's partial files.
    """
    if root is None:
        name = 'digits' if size == 32 and max_per_class is None else f'digits_{size}px_{max_per_class or "all"}'
        root = default_cache_dir() / name
    root = Path(root)
    marker = root / 'DIGITS_CACHE'
    if marker.is_file():
        return root
    if root.exists():
        raise UsageError(
            f'{root} exists but is not a complete digits cache (no {marker.name} file); '
            f'remove it and run again to rebuild it')
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise UsageError(
            'the demo dataset comes from scikit-learn (sklearn.datasets.load_digits, bundled with the '
            'package, no download): pip install scikit-learn') from e
    from PIL import Image

    digits = load_digits()
    images = np.clip(np.round(digits.images * (255. / 16.)), 0, 255).astype(np.uint8)
    targets = digits.target
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{root.name}-', dir=root.parent))
    counts = {'train': 0, 'val': 0}
    try:
        for cls in range(10):
            indices = np.flatnonzero(targets == cls)
            if max_per_class is not None:
                indices = indices[:max_per_class]
            for k, i in enumerate(indices):
                split = 'val' if k % val_every == 0 else 'train'
                folder = tmp / split / str(cls)
                folder.mkdir(parents=True, exist_ok=True)
                img = Image.fromarray(images[i], mode='L').resize((size, size), Image.BICUBIC)
                img.save(folder / f'{i:04d}.png')
                counts[split] += 1
        (tmp / 'DIGITS_CACHE').write_text(
            f'version {DIGITS_CACHE_VERSION}\n'
            f'source sklearn.datasets.load_digits (UCI optical recognition of handwritten digits, 8x8 scans)\n'
            f'size {size}x{size} bicubic, val = every {val_every}th sample of each class, '
            f'max_per_class {max_per_class}\n'
            f'train {counts["train"]} images, val {counts["val"]} images, 10 classes\n')
        try:
            os.rename(tmp, root)
        except OSError:
            if not marker.is_file():  # not a concurrent builder finishing first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root

