""" A user's own small photo folder on a CPU (issue 36 item 2): the shipped recipe ``-c own_folder_cpu``, a
training set smaller than one batch, the warning when full batches leave images out, the log naming the folder
or tar it read, the hint when no recipe is given; (slow) the recipe learns two imagenette classes from 120
photos. The loader-level checks are in tests/test_data.py. """
import logging
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import mlp_vision.train as train  # noqa: E402
from mlp_vision.arguments import find_recipe, parse_args_with_config  # noqa: E402

# the recipe, at a tiny width / size so a run takes seconds
TINY = ['--model-kwargs', 'embed_dim=8', 'depths=(1,1,1,1)', '--img-size', '32', '--workers', '0',
        '--log-interval', '100']
IMAGENETTE = REPO.parent / 'shared' / 'data' / 'imagenette-mini'


def _photos(root: Path, counts, size=40, seed=0):
    """root/<split>/<class>/<i>.png of random colour images; ``counts`` = {split: {class: n}}."""
    rng = np.random.default_rng(seed)
    for split, classes in counts.items():
        for cls, n in classes.items():
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(root / split / cls / f'{i}.png')
    return root


def test_own_folder_recipe_is_found_by_name_and_is_small():
    """``-c own_folder_cpu`` is the shipped configs/own_folder_cpu.yaml (tests/test_train.py checks every recipe
    parses and is listed): a small model at a low resolution, AdamW, tens of epochs, lr scaled from its batch."""
    assert find_recipe('own_folder_cpu') == REPO / 'configs' / 'own_folder_cpu.yaml'
    assert find_recipe(train.OWN_FOLDER_RECIPE) == find_recipe('own_folder_cpu')
    args, _ = parse_args_with_config(train.build_parser(), ['-c', 'own_folder_cpu', '--data-dir', 'x'], recipes=True)
    assert args.model == 'smlpnet_t' and args.model_kwargs == {'embed_dim': 32, 'depths': [1, 1, 2, 1]}
    assert args.img_size == 64 and args.img_size % 32 == 0  # sMLPNet needs a multiple of 32
    assert args.opt == 'adamw' and 10 <= args.epochs <= 60 and args.aug_repeats == 0 and not args.model_ema
    assert args.lr is None and args.lr_base_size == args.batch_size  # lr_base is the lr at the recipe's batch


def test_small_folder_batch_fitted_and_log_names_the_folder(tmp_path, caplog):
    """12 photos and the recipe's batch 20: one batch of all 12 (said in a warning; the lr scaled to batch 12),
    not a stop or a silent subset; the log names the folders read, though the split was asked for as a tar."""
    data = _photos(tmp_path / 'data', {'train': {'cats': 6, 'dogs': 6}, 'val': {'cats': 3, 'dogs': 3}})
    with caplog.at_level(logging.INFO):
        results = train.main(['-c', 'own_folder_cpu', '--data-dir', str(data), '--epochs', '1', '--train-split',
                              'train.tar', '--output', str(tmp_path / 'out'), '--experiment', 'run'] + TINY)
    assert '--batch-size 20 is more than the 12 training images each process draws per epoch' in caplog.text
    assert 'unused' not in caplog.text  # all 12 train, every epoch
    assert results['global_batch'] == 12 and results['lr'] == pytest.approx(1e-3 * 12 / 20)
    log = (tmp_path / 'out' / 'run' / 'train.log').read_text()
    assert (f'12 training images (folder {data / "train"}), 6 validation images (folder {data / "val"}), '
            f'2 classes') in log
    assert 'train.tar' not in log and 'an epoch trains' not in log


def test_images_left_out_by_full_batches_are_warned_and_logged(tmp_path, caplog):
    """30 photos in a tar, batch 8: 6 sit out every epoch; the console warns with the count and a batch size that
    uses them all, train.log's setup line says how much an epoch trains, and names the tar it read."""
    data = _photos(tmp_path / 'photos', {'train': {'a': 15, 'b': 15}, 'val': {'a': 2, 'b': 2}})
    with tarfile.open(tmp_path / 'train.tar', 'w') as tf:
        tf.add(data / 'train', arcname='train')
    (data / 'val').rename(tmp_path / 'val')
    with caplog.at_level(logging.INFO):
        train.main(['-c', 'own_folder_cpu', '--data-dir', str(tmp_path), '--epochs', '1', '-b', '8',
                    '--output', str(tmp_path / 'out'), '--experiment', 'run'] + TINY)
    assert ('6 of the 30 training images (20 %) are unused in every epoch: the training loader keeps full batches '
            'only (30 images = 3 x batch 8 + 6 dropped') in caplog.text
    assert '--batch-size 10 leaves none out' in caplog.text
    log = (tmp_path / 'out' / 'run' / 'train.log').read_text()
    assert f'30 training images (tar {tmp_path / "train.tar"}), 4 validation images (folder {tmp_path / "val"})' in log
    assert 'Training 1 epochs x 3 updates, global batch 8' in log and 'an epoch trains 24 samples of the 30 images' in log


def test_no_recipe_on_small_data_names_the_own_folder_recipe(caplog):
    """A small folder given without -c and with the default schedule (timm's ImageNet one: 300 epochs, SGD, 224
    px, hours on a CPU) is trained as asked, with a warning naming the recipe for it; a recipe, another --epochs,
    a resumed run or an ImageNet-sized set get none."""
    def warning(argv, num_images=120):
        args, _ = parse_args_with_config(train.build_parser(), argv + ['--data-dir', 'x'], recipes=True)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            train._hint_small_data_recipe(args, num_images)
        return caplog.text

    text = warning([])
    assert ("no -c recipe: 120 training images get timm's ImageNet defaults (300 epochs of --opt sgd, smlpnet_t at "
            "its default size), made for a million images on GPUs: hours on a CPU") in text
    assert '-c own_folder_cpu trains a small model in minutes' in text
    assert 'at 96 px' in warning(['--img-size', '96'])
    for argv, num_images in ((['-c', 'own_folder_cpu'], 120), (['--epochs', '20'], 120), ([], 1_281_167)):
        assert warning(argv, num_images) == ''


@pytest.mark.slow  # about 2 minutes on 2 busy CPU cores (results/own_folder/README.md)
@pytest.mark.skipif(not (IMAGENETTE / 'train.tar').is_file(),
                    reason=f'needs the shared imagenette-mini tars at {IMAGENETTE} (../shared beside the repo)')
def test_own_folder_recipe_learns_two_photo_classes(tmp_path):
    """The documented command on the measured folder: two imagenette classes (tench, English springer), the first
    60 training photos of each by name and all 100 validation photos of each, extracted as an ImageFolder tree;
    the recipe reaches a validation top-1 far above chance (50 %); recorded: 84.5 %."""
    data = tmp_path / 'photos'
    for split, per_class in (('train', 60), ('val', 100)):
        with tarfile.open(IMAGENETTE / f'{split}.tar') as tf:
            names = sorted(m.name for m in tf.getmembers() if m.isfile())
            for wnid, label in (('n01440764', 'tench'), ('n02102040', 'springer')):
                (data / split / label).mkdir(parents=True)
                for name in [n for n in names if n.startswith(f'{split}/{wnid}/')][:per_class]:
                    (data / split / label / Path(name).name).write_bytes(tf.extractfile(name).read())
    results = train.main(['-c', 'own_folder_cpu', '--data-dir', str(data), '--output', str(tmp_path / 'out'),
                          '--experiment', 'run'])
    assert results['eval']['samples'] == 200
    assert results['best']['metric'] > 70.
