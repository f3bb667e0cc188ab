""" The image folder / tar dataset: timm's ``ImageDataset`` over :class:`.reader.ImageFileReader`.

timm's ``ImageDataset.__getitem__`` converts with ``Image.convert`` (wrong for 16-bit, float and premultiplied
images) and, when an image fails to load, returns the next sample in its place, so a corrupt file silently
doubles another image in training and in the metrics. Here an image is decoded by :func:`.decode.load_image`,
and one that cannot be used is returned as a :class:`.decode.SkippedImage`, never replaced; the loaders of
:mod:`.loader` leave it out of its batch and count it.
"""
from typing import Callable, Dict, List, Optional, Tuple, Union

from timm.data import ImageDataset

from mlp_vision.training.data.decode import SkippedImage, load_image
from mlp_vision.training.data.reader import ImageFileReader

__all__ = ['ImageFileDataset']


class ImageFileDataset(ImageDataset):
    """Labelled images of an ImageFolder tree or an uncompressed image tar (``--dataset ''``): see
    :class:`.reader.ImageFileReader` for the layouts and labels.

    ``__getitem__`` returns ``(transform(image), target)``, or a :class:`.decode.SkippedImage` when the image
    cannot be used (see :func:`.decode.load_image`): the loaders of this package leave those out and count them.
    """

    def __init__(
            self,
            root: str,
            class_map: Optional[Union[str, Dict[str, int]]] = None,
            class_to_idx: Optional[Dict[str, int]] = None,
            input_img_mode: Optional[str] = 'RGB',
            transform: Optional[Callable] = None,
    ):
        reader = ImageFileReader(root, class_map=class_map, class_to_idx=class_to_idx)
        super().__init__(root, reader=reader, input_img_mode=input_img_mode, transform=transform)
        self.root = root

    @property
    def samples(self) -> List[Tuple[str, int]]:
        """``(path relative to the root or tar, target)`` of every image, in natural order."""
        return self.reader.samples

    @property
    def class_to_idx(self) -> Dict[str, int]:
        return self.reader.class_to_idx

    @property
    def other_classes(self) -> List[str]:
        """Class folders left out because ``class_to_idx`` / the class map does not name them."""
        return self.reader.other_classes

    @property
    def is_tar(self) -> bool:
        return self.reader.is_tar

    def __getitem__(self, index: int):
        try:
            fp, target = self.reader[index]
            with fp:
                img = load_image(fp, self.input_img_mode, self.filename(index))
        except Exception as e:  # any decode failure skips this image only (KeyboardInterrupt etc. pass)
            return SkippedImage(self.filename(index), f'{type(e).__name__}: {e}')
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target
