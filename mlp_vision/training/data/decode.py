""" Opening one image and bringing it to the model's PIL mode.

timm's ``ImageDataset`` opens an image with ``Image.open(...).convert(mode)``: PIL's own conversion clips 16-bit,
32-bit and float grayscale at 255 (a 16-bit PNG becomes almost all white), drops premultiplied alpha wrongly, and
a decompression bomb in PIL's warn-only range (1x to 2x ``Image.MAX_IMAGE_PIXELS``) is decoded anyway. Here every
mode PIL decodes is converted to the right values (:func:`convert_image_mode`), anything unusable raises
(:func:`load_image`), and a sample whose image cannot be used becomes a :class:`SkippedImage`.
"""
import contextlib
import dataclasses
import io
import logging
import os
import warnings
from typing import Optional, Union

import numpy as np
from PIL import Image

__all__ = ['SkippedImage', 'UnusableImageError', 'convert_image_mode', 'load_image']

_logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SkippedImage:
    """What :class:`.reader.ImageFileDataset` returns in place of a sample whose image cannot be used: its ``name``
    (file path, or ``tar:member``) and the ``reason``. The loaders leave it out of the batch, warn once with
    both and count it (:attr:`ImageLoader.skipped`); it is never replaced by another sample (and, not being a
    tuple, never unpacked as one)."""
    name: str
    reason: str


class UnusableImageError(ValueError):
    """An image that decodes, but in a pixel format with no defined 8-bit scale (e.g. signed 32-bit values)."""


_SIXTEEN_BIT_MODES = frozenset({'I;16', 'I;16L', 'I;16B', 'I;16N'})


def _to_8bit_grayscale(img: Image.Image) -> Image.Image:
    """An 'L' image from a 16-bit ('I;16*'), 32-bit integer ('I') or float ('F') grayscale image: 16-bit values v
    (and 'I' images within 0..65535, which is what 16-bit files decode to) map to round(v / 257), floats in [0, 1]
    to round(255 v). Other value ranges have no defined scale and raise :class:`UnusableImageError`."""
    values = np.asarray(img)
    if img.mode == 'F':
        if not np.isfinite(values).all() or values.min() < 0 or values.max() > 1:
            raise UnusableImageError(
                f'float (mode F) image with values {values.min():g}..{values.max():g}; only 0..1 has a defined '
                f'8-bit scale')
        return Image.fromarray(np.round(values * 255.).astype(np.uint8))
    values = values.astype(np.int64)
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise UnusableImageError(
            f'32-bit integer (mode {img.mode}) image with values {values.min()}..{values.max()}; only 0..65535 '
            f'(16-bit) has a defined 8-bit scale')
    return Image.fromarray(((values + 128) // 257).astype(np.uint8))


def convert_image_mode(img: Image.Image, mode: Optional[str] = 'RGB') -> Image.Image:
    """``img`` in PIL ``mode`` (none: unchanged), correct for every mode PIL decodes.

    16-bit / 32-bit / float grayscale is scaled to 8 bits first (:func:`_to_8bit_grayscale`); premultiplied
    'La' and palette images with a transparency entry go through their straight-alpha form; alpha is then
    dropped as by ``Image.convert`` (the stored colours are kept). CMYK, YCbCr, LAB, HSV, '1' and the rest
    convert with ``Image.convert``.
    """
    if not mode or img.mode == mode:
        return img
    if img.mode in _SIXTEEN_BIT_MODES or img.mode in ('I', 'F'):
        img = _to_8bit_grayscale(img)
    elif img.mode == 'La':  # PIL converts La only to LA
        img = img.convert('LA')
    elif img.mode == 'P' and 'transparency' in img.info:  # PIL asks for this step (and warns without it)
        img = img.convert('RGBA')
    return img if img.mode == mode else img.convert(mode)


# whether this process has said that a multi-frame image was read by its first frame (said once: a folder of
# scanned documents would otherwise warn per file, per epoch)
_said_first_frame = False


def _note_first_frame(img: Image.Image, name: str) -> None:
    """Warn, once per process, that ``img`` (a multi-page TIFF, an animated GIF / WebP) is read by its first frame
    only (a classification sample is one image)."""
    global _said_first_frame
    frames = getattr(img, 'n_frames', 1)
    if frames > 1 and not _said_first_frame:
        _said_first_frame = True
        _logger.warning(f'{name} holds {frames} frames (pages); only the first is read, as for every multi-frame '
                        f'image of this dataset (said once): save the pages as separate files to use them all')


def load_image(fp: Union[str, os.PathLike, io.IOBase], mode: Optional[str] = 'RGB',
               name: Optional[str] = None) -> Image.Image:
    """Open and fully decode one image (first frame; one warning per process names a file of several, ``name``
    default ``fp``) and convert it with :func:`convert_image_mode`.

    Raises for anything unusable: unreadable / truncated / corrupt files (``OSError``, ``SyntaxError``, ...),
    images larger than PIL's decompression-bomb limit ``PIL.Image.MAX_IMAGE_PIXELS`` (PIL only warns between 1x
    and 2x the limit; here both raise, so one huge image cannot exhaust a worker's memory) and
    :class:`UnusableImageError`.
    """
    name = name or str(getattr(fp, 'name', fp))
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.simplefilter('error', Image.DecompressionBombWarning)
        if isinstance(fp, (str, os.PathLike)):
            fp = stack.enter_context(open(fp, 'rb'))
        img = Image.open(fp)
        _note_first_frame(img, name)  # before load: counting a TIFF's pages seeks, dropping decoded data
        img.load()  # decode now, while the file is open: truncated data fails here
    return convert_image_mode(img, mode)

