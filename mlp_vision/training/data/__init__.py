""" Datasets and loaders for train.py / validate.py: timm's datasets, transforms, samplers and prefetcher, and a
thin layer for what timm lacks, so that image data never gives a silent wrong result. Each module says at its
top what timm lacks there:

* :mod:`.reader_folder` / :mod:`.reader_tar` -- finding the images of a folder tree / a tar, each once;
* :mod:`.reader` -- their labels, where a split is, and :class:`ImageFileDataset` (timm's ``Reader`` /
  ``ImageDataset`` over them);
* :mod:`.class_map` -- ``--class-map`` read as text, never unpickled;
* :mod:`.decode` -- opening an image and converting every PIL mode correctly; unusable images skipped;
* :mod:`.holdout` -- ``--val-split FRACTION``; :mod:`.labels` -- class names, checked against the model's;
* :mod:`.dataset_factory` -- the training / validation datasets (timm's ``create_dataset`` for ``--dataset``);
* :mod:`.loader` -- seeded augmentation, skipping and counting unreadable images, exact distributed evaluation;
* :mod:`.args` -- the data flags' checks; :mod:`.digits` -- the demo dataset.

What each input does is listed, with its test, in ``docs/what_happens_when.md`` ("Image data").
"""
from mlp_vision.training.data.args import (
    DATASET_KINDS, IMAGE_MODE_CHANNELS, INTERPOLATIONS, check_image_args, default_workers)
from mlp_vision.training.data.class_map import read_class_map
from mlp_vision.training.data.dataset_factory import create_image_dataset, create_train_val_datasets, dataset_source
from mlp_vision.training.data.decode import SkippedImage, UnusableImageError, convert_image_mode, load_image
from mlp_vision.training.data.digits import default_cache_dir, prepare_digits_folder
from mlp_vision.training.data.holdout import DatasetSubset, holdout_split, parse_val_split, stratified_holdout
from mlp_vision.training.data.labels import (
    check_class_names, check_num_classes, dataset_class_names, dataset_class_to_idx)
from mlp_vision.training.data.loader import (
    ImageLoader, ReadableBatches, SeededDataset, SeededSampler, StridedSampler, collate_readable, create_eval_loader,
    create_train_loader, fit_batch_to_data, seeded_rng, train_samples_per_rank, unused_images_message)
from mlp_vision.training.data.reader import ImageFileDataset, ImageFileReader, find_split
