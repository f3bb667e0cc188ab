""" Image data that never gives a silent wrong result (mlp_vision.image_data): validation
splits, image tars, nested class folders, every PIL mode, unreadable images, a class with no usable image, signals
to the process group. Every test makes its own tiny data in tmp_path. """
import io
import json
import logging
import os
import re
import pickle
import subprocess
import sys
import tarfile
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn as nn
from PIL import Image

from mlp_vision.errors import RunError, UsageError
from mlp_vision.image_data import (
    ImageFileDataset, SkippedImage, convert_image_mode, create_eval_loader, create_image_dataset, create_train_loader,
    create_train_sampler, create_train_val_datasets, dataset_class_names, dataset_source, fit_batch_to_data, load_image,
    parse_val_split, read_class_map, stratified_holdout, train_samples_per_rank, unused_images_message,
)
from mlp_vision.image_model import validate

SIZE = 8
DATA_CONFIG = dict(input_size=(3, SIZE, SIZE), interpolation='bilinear', mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
                   crop_pct=1.0, crop_mode='center')
CPU = torch.device('cpu')
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _image(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))


def _folder(root, counts, start=0):
    """root/<class>/<i>.png for {class: count}; returns {relative path: class}."""
    made, seed = {}, start
    for cls, n in counts.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            _image(seed).save(root / cls / f'{seed}.png')
            made[f'{cls}/{seed}.png'] = cls
            seed += 1
    return made


def _tar(path, members):
    """An uncompressed tar of {member name: bytes}."""
    with tarfile.open(path, 'w') as tf:
        for name, data in members.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path


def _png_bytes(img: Image.Image, fmt='PNG') -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _labels(ds):
    """{file name: class name} as the dataset labels them."""
    names = dataset_class_names(ds)
    return {os.path.basename(ds.filename(i)): names[ds[i][1]] for i in range(len(ds))}


# ---------------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize('layout', ['flat', 'train_only', 'tar_as_root'])
def test_no_validation_split_is_a_one_line_error(tmp_path, layout):
    """A root of class folders, a root with only train/, or a .tar given as the data dir: no validation split,
    so an error that names the choices; never the training images validated on."""
    if layout == 'flat':
        _folder(tmp_path / 'data', {'a': 2, 'b': 2})
        root = tmp_path / 'data'
    elif layout == 'train_only':
        _folder(tmp_path / 'data' / 'train', {'a': 2, 'b': 2})
        root = tmp_path / 'data'
    else:
        root = _tar(tmp_path / 'train.tar', {f'{c}/{i}.png': _png_bytes(_image(i)) for c in 'ab' for i in range(2)})
    train, _ = create_train_val_datasets('', str(root), 'train', '')  # no validation asked for: fine
    assert len(train) == 4
    with pytest.raises(UsageError) as e:
        create_train_val_datasets('', str(root), 'train', 'validation')
    msg = str(e.value)
    assert 'no validation split found' in msg and '--val-split FRACTION' in msg and 'val/' in msg
    assert '\n' not in msg


def test_val_split_fraction_is_a_seeded_stratified_disjoint_holdout(tmp_path):
    made = _folder(tmp_path / 'data', {'a': 20, 'b': 10, 'c': 3})
    train, val = create_train_val_datasets('', str(tmp_path / 'data'), 'train', '0.2', seed=7)
    train_files, val_files = set(_labels(train)), set(_labels(val))
    assert not train_files & val_files
    assert train_files | val_files == {os.path.basename(p) for p in made}
    # per class round(0.2 n), and no class leaves training
    assert Counter(_labels(val).values()) == {'a': 4, 'b': 2, 'c': 1}
    assert Counter(_labels(train).values()) == {'a': 16, 'b': 8, 'c': 2}
    # labels are right: each image is labelled by its folder
    assert all(made[f'{c}/{f}'] == c for f, c in {**_labels(train), **_labels(val)}.items())
    # deterministic from the seed, a different seed holds out other images
    _, again = create_train_val_datasets('', str(tmp_path / 'data'), 'train', 0.2, seed=7)
    _, other = create_train_val_datasets('', str(tmp_path / 'data'), 'train', 0.2, seed=8)
    assert set(_labels(again)) == val_files and set(_labels(other)) != val_files
    # the two parts have their own transforms (a loader sets each)
    train.transform = lambda img: 'train'
    val.transform = lambda img: 'val'
    assert train[0][0] == 'train' and val[0][0] == 'val'


def test_stratified_holdout_does_not_depend_on_sample_order():
    names = [f'img{i}' for i in range(30)]
    targets = [i % 3 for i in range(30)]
    _, held = stratified_holdout(names, targets, 0.3, seed=1)
    order = np.random.default_rng(0).permutation(30)
    _, held_shuffled = stratified_holdout([names[i] for i in order], [targets[i] for i in order], 0.3, seed=1)
    assert {names[i] for i in held} == {names[order[i]] for i in held_shuffled}
    assert Counter(targets[i] for i in held) == {0: 3, 1: 3, 2: 3}


@pytest.mark.parametrize('value', ['0', '1', '1.5', '-0.1', 'nan', 2.0])
def test_val_split_fraction_out_of_range(value):
    with pytest.raises(UsageError, match='between 0 and 1'):
        parse_val_split(value)


def test_val_folder_found_by_synonym_and_labelled_by_class_name(tmp_path):
    """validation/ (a synonym of 'val') is found; a validation set that lacks a class keeps the other classes'
    training labels; an extra class is an error."""
    _folder(tmp_path / 'train', {'a': 2, 'b': 2, 'c': 2})
    _folder(tmp_path / 'validation', {'a': 1, 'c': 1}, start=100)
    train, val = create_train_val_datasets('', str(tmp_path), 'train', 'val')
    assert dataset_class_names(val) == dataset_class_names(train) == ['a', 'b', 'c']
    assert sorted(val[i][1] for i in range(len(val))) == [0, 2]
    _folder(tmp_path / 'validation', {'d': 1}, start=200)
    with pytest.raises(UsageError, match=r'validation set .* has class folders \[d\] not among its classes \[a, b, c'):
        create_train_val_datasets('', str(tmp_path), 'train', 'val')


def test_single_split_for_validate(tmp_path):
    """validate.py reads one split: a flat class-folder root is that split; a root with other splits but not
    the one asked for is an error that lists what is there."""
    _folder(tmp_path / 'flat', {'a': 1, 'b': 1})
    assert len(create_image_dataset('', str(tmp_path / 'flat'), 'validation')) == 2
    _folder(tmp_path / 'two' / 'train', {'a': 1})
    with pytest.raises(UsageError, match="no dataset split 'validation' in .* \\(it has train/"):
        create_image_dataset('', str(tmp_path / 'two'), 'validation')
    (tmp_path / 'empty' / 'val' / 'cls').mkdir(parents=True)
    with pytest.raises(UsageError, match='is empty'):
        create_image_dataset('', str(tmp_path / 'empty'), 'val')


# ---------------------------------------------------------------------------------------------------- tars


def test_split_tars_read_like_folders(tmp_path):
    """root/train.tar and root/val.tar (images under a leading val/ folder, as imagenette's tars) with split
    names 'train' / 'validation' or 'train.tar' / 'val.tar'; pixels equal the source images."""
    images = {f'{c}/{c}{i}.png': _image(10 * k + i) for k, c in enumerate('ab') for i in range(3)}
    _tar(tmp_path / 'train.tar', {**{f'./{n}': _png_bytes(img) for n, img in images.items()},
                                  'a/._a0.png': b'macOS resource fork', '.hidden/x.png': b''})
    _tar(tmp_path / 'val.tar', {f'val/{n}': _png_bytes(img) for n, img in images.items()})
    for splits in [('train', 'validation'), ('train.tar', 'val.tar')]:
        train, val = create_train_val_datasets('', str(tmp_path), *splits)
        for ds in (train, val):
            assert dataset_class_names(ds) == ['a', 'b']
            assert _labels(ds) == {n.split('/')[1]: n[0] for n in images}
            for i in range(len(ds)):
                name = ds.filename(i).split(':', 1)[1].removeprefix('val/')
                assert np.array_equal(np.asarray(ds[i][0]), np.asarray(images[name]))


def test_tar_of_class_tars(tmp_path):
    """ImageNet's train tar layout: one tar per class inside the tar."""
    inner = {c: _tar(tmp_path / f'{c}.tar', {f'{c}{i}.png': _png_bytes(_image(i)) for i in range(2)})
             for c in ('n01', 'n02')}
    (tmp_path / 'data').mkdir()
    _tar(tmp_path / 'data' / 'train.tar', {f'{c}.tar': p.read_bytes() for c, p in inner.items()})
    ds = create_image_dataset('', str(tmp_path / 'data'), 'train')
    assert _labels(ds) == {'n010.png': 'n01', 'n011.png': 'n01', 'n020.png': 'n02', 'n021.png': 'n02'}
    assert np.array_equal(np.asarray(ds[3][0]), np.asarray(_image(1)))


@pytest.mark.parametrize('cut', ['mid_header', 'member_boundary', 'mid_data'])
def test_truncated_tar_is_a_one_line_error_naming_it(tmp_path, cut):
    full = _tar(tmp_path / 'full.tar', {f'a/{i}.png': _png_bytes(_image(i)) for i in range(4)}).read_bytes()
    with tarfile.open(tmp_path / 'full.tar') as tf:
        last = tf.getmembers()[-1]
    end = {'mid_header': last.offset + 100, 'member_boundary': last.offset, 'mid_data': last.offset_data + 10}[cut]
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'train.tar').write_bytes(full[:end])
    with pytest.raises(UsageError) as e:
        create_image_dataset('', str(tmp_path / 'data'), 'train')
    msg = str(e.value)
    assert 'train.tar is truncated' in msg and '\n' not in msg


# ---------------------------------------------------------------------------------------------------- folders


def test_images_in_subfolders_belong_to_their_class_folder(tmp_path):
    _folder(tmp_path / 'train', {'a': 2, 'b': 1})
    (tmp_path / 'train' / 'a' / 'more' / 'deeper').mkdir(parents=True)
    _image(50).save(tmp_path / 'train' / 'a' / 'more' / 'deeper' / 'x.png')
    (tmp_path / 'train' / '.hidden').mkdir()
    _image(51).save(tmp_path / 'train' / '.hidden' / 'y.png')
    ds = create_image_dataset('', str(tmp_path), 'train')
    assert dataset_class_names(ds) == ['a', 'b']
    assert _labels(ds) == {'0.png': 'a', '1.png': 'a', 'x.png': 'a', '2.png': 'b'}


def test_image_outside_a_class_folder_is_an_error(tmp_path):
    _folder(tmp_path / 'train', {'a': 1})
    _image(0).save(tmp_path / 'train' / 'loose.png')
    with pytest.raises(UsageError, match='outside class folders \\(loose.png\\)'):
        create_image_dataset('', str(tmp_path), 'train')


# ---------------------------------------------------------------------------------------------------- symlinks

_SCAN_SCRIPT = """
import json, logging, sys
from mlp_vision.image_data import ImageFileDataset, dataset_class_names
from mlp_vision.errors import RunError, UsageError
warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger().addHandler(Keep(logging.WARNING))
results = []
for root in sys.argv[1:]:
    warnings.clear()
    try:
        ds = ImageFileDataset(root)
        names = dataset_class_names(ds)
        results.append({'samples': {p: names[t] for p, t in ds.samples}, 'warnings': list(warnings)})
    except UsageError as e:
        results.append({'error': str(e), 'warnings': list(warnings)})
print(json.dumps(results))
"""


def _scan_in_subprocess(*roots):
    """ImageFileDataset(root) of each root, in one other process with a time limit (a symlink loop used to walk
    forever, filling the memory): per root ``{'samples': {relative path: class}, 'warnings': [...]}`` or
    ``{'error': ...}``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO] + [p for p in os.environ.get('PYTHONPATH', '').split(
        os.pathsep) if p]))
    try:
        proc = subprocess.run([sys.executable, '-c', _SCAN_SCRIPT, *map(str, roots)], capture_output=True, text=True,
                              env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f'reading {roots} did not end within 120 s (a symlink loop followed forever)')
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _loop_layout(root, kind):
    """Classes a (3 images and a/sub/deep.png, with the links of ``kind``) and b (2 images); returns
    ({link that must be named in one warning: what the warning says}, {extra image: class})."""
    _folder(root, {'a': 3, 'b': 2})
    for sub in ('sub', 'sub2'):
        (root / 'a' / sub).mkdir()
    _image(9).save(root / 'a' / 'sub' / 'deep.png')
    outside = root.parent / 'outside'
    loop = 'it points to a folder that contains it (a loop)'
    links, warned, extra = {  # {link: target}, {link named in a warning: why}, {extra image: class}
        'self': ({'a/loop': '.'}, {'a/loop': loop}, {}),  # a link to the class folder itself
        'two_loops': ({'a/loop1': '.', 'a/sub/loop2': '..'},  # the issue's case: walked forever before
                      {'a/loop1': loop, 'a/sub/loop2': loop}, {}),
        'root': ({'a/sub/up': '../..', 'top': '.'},  # to the dataset root, from a class and as a class folder
                 {'a/sub/up': loop, 'top': 'the dataset root or a folder above it (a loop)'}, {}),
        # two links pointing at each other's folders, in a class and outside the dataset (read from a/out: x's
        # link to y is followed, y's link back to x is skipped)
        'mutual': ({'a/sub/to_sub2': '../sub2', 'a/sub2/to_sub': '../sub'},
                   {'a/sub/to_sub2': 'already read as a/sub2', 'a/sub2/to_sub': 'already read as a/sub'}, {}),
        'mutual_outside': ({f'{outside}/x/to_y': '../y', f'{outside}/y/to_x': '../x', 'a/out': f'{outside}/x'},
                           {'a/out/to_y/to_x': 'already read as a/out'}, {'a/out/11.png': 'a', 'a/out/to_y/12.png': 'a'}),
    }[kind]
    if kind == 'mutual_outside':
        _folder(outside, {'x': 1, 'y': 1}, start=11)
    for link, target in links.items():
        os.symlink(target, root / link)
    return warned, extra


LOOP_KINDS = ['self', 'two_loops', 'root', 'mutual', 'mutual_outside']


@pytest.fixture(scope='module')
def scanned_loop_layouts(tmp_path_factory):
    """Each kind's layout and what reading it gave: {kind: (warned, extra, result)}, all read in one subprocess
    (the interpreter and torch start once, not once per kind)."""
    layouts = {kind: (tmp_path_factory.mktemp(kind) / 'train') for kind in LOOP_KINDS}
    expected = {kind: _loop_layout(root, kind) for kind, root in layouts.items()}
    results = _scan_in_subprocess(*layouts.values())
    return {kind: (*expected[kind], result) for kind, result in zip(layouts, results)}


@pytest.mark.parametrize('kind', LOOP_KINDS)
def test_symlink_loops_are_skipped_with_a_warning_and_counts_are_true(scanned_loop_layouts, kind):
    """The issue's data: a symlink loop in a class folder walked forever (two loops) or multiplied the images
    and filed them under the looping class (one loop). Each loop is now skipped with one warning naming the
    link and where it points; every image is read once, with its class."""
    warned, extra, result = scanned_loop_layouts[kind]
    assert result['samples'] == {'a/0.png': 'a', 'a/1.png': 'a', 'a/2.png': 'a', 'a/sub/deep.png': 'a',
                                 'b/3.png': 'b', 'b/4.png': 'b', **extra}
    for link, why in warned.items():
        named = [w for w in result['warnings'] if f'skipped the symlink {link} -> ' in w]
        assert len(named) == 1 and why in named[0], (link, result['warnings'])
    assert len(result['warnings']) == len(warned), result['warnings']


def test_links_between_class_folders_are_refused(tmp_path):
    """A link that puts a folder or an image of one class into another (including two links pointing at each
    other's folders) would give those images two labels: one line naming both paths."""
    _folder(tmp_path / 'mutual', {'a': 1, 'b': 1})
    os.symlink('../b', tmp_path / 'mutual' / 'a' / 'to_b')
    os.symlink('../a', tmp_path / 'mutual' / 'b' / 'to_a')
    result, = _scan_in_subprocess(tmp_path / 'mutual')
    assert result['error'].endswith('the image a/to_b/1.png is the same file as b/1.png (a link): one image in two '
                                    'classes has no single label; expected each image in the folder of one class')

    _folder(tmp_path / 'file', {'a': 2, 'b': 1})
    os.symlink('../a/0.png', tmp_path / 'file' / 'b' / 'borrowed.png')
    with pytest.raises(UsageError, match='the image b/borrowed.png is the same file as a/0.png') as e:
        ImageFileDataset(str(tmp_path / 'file'))
    assert '\n' not in str(e.value)

    _folder(tmp_path / 'same', {'a': 2})
    os.symlink('a', tmp_path / 'same' / 'b')
    with pytest.raises(UsageError, match='the image b/0.png is the same file as a/0.png'):  # class folders: one folder
        ImageFileDataset(str(tmp_path / 'same'))
    _folder(tmp_path / 'nested', {'a': 1})
    (tmp_path / 'nested' / 'a' / 'sub').mkdir()
    _image(5).save(tmp_path / 'nested' / 'a' / 'sub' / 'x.png')
    os.symlink('a/sub', tmp_path / 'nested' / 'b')
    with pytest.raises(UsageError, match='the image b/x.png is the same file as a/sub/x.png'):  # nested class folders
        ImageFileDataset(str(tmp_path / 'nested'))


def test_legit_symlinks_count_once(tmp_path, caplog):
    """A class folder that is a link to elsewhere, a link to an outside folder inside a class and a linked image
    are read (each image once, in the class of the link); links that reach a file the class already has are
    counted once, with a warning."""
    elsewhere = tmp_path / 'elsewhere'
    _folder(elsewhere, {'bb': 2, 'extra': 2}, start=10)
    _image(30).save(elsewhere / 'single.png')
    root = tmp_path / 'train'
    _folder(root, {'a': 2})
    os.symlink(elsewhere / 'bb', root / 'b')  # a class folder that is a link
    os.symlink(elsewhere / 'extra', root / 'a' / 'more')  # a link to an outside folder
    os.symlink(elsewhere / 'single.png', root / 'a' / 'single.png')  # a linked image
    os.symlink('0.png', root / 'a' / 'again.png')  # the same file twice in one class
    (root / 'a' / 'sub').mkdir()
    _image(40).save(root / 'a' / 'sub' / 's.png')
    os.symlink('sub', root / 'a' / 'more_sub')  # a folder of the class read twice
    with caplog.at_level(logging.WARNING):
        ds = ImageFileDataset(str(root))
    assert {p: dataset_class_names(ds)[t] for p, t in ds.samples} == {
        'a/0.png': 'a', 'a/1.png': 'a', 'a/more/12.png': 'a', 'a/more/13.png': 'a', 'a/single.png': 'a',
        'a/sub/s.png': 'a', 'b/10.png': 'b', 'b/11.png': 'b'}
    assert np.array_equal(np.asarray(ds[ds.samples.index(('a/single.png', 0))][0]), np.asarray(_image(30)))
    assert 'skipped the symlink a/more_sub' in caplog.text and 'already read as a/sub' in caplog.text
    assert '1 image path(s) reach a file already counted' in caplog.text and 'a/again.png is a/0.png' in caplog.text


def _tar_with_links(path, members, links):
    """An uncompressed tar of {name: bytes} then {name: (tarfile.SYMTYPE | LNKTYPE, link target)}."""
    with tarfile.open(path, 'w') as tf:
        for name, data in members.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        for name, (kind, target) in links.items():
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname = kind, target
            tf.addfile(ti)
    return path


def test_tar_link_members(tmp_path):
    """Tar members that are links read like the folder the tar was made from: a hard link is an image of its
    own (its file's data), a symlink to an image in the tar is that image (counted once in its class, refused
    in another), a symlink to anything the tar does not hold is refused (it used to be dropped silently)."""
    images = {f'{c}/{c}{i}.png': _png_bytes(_image(10 * k + i)) for k, c in enumerate('ab') for i in range(2)}
    ok = _tar_with_links(tmp_path / 'ok.tar', images, {
        'a/hard.png': (tarfile.LNKTYPE, 'a/a0.png'), 'a/soft.png': (tarfile.SYMTYPE, 'a1.png'),
        'b/chain.png': (tarfile.SYMTYPE, 'b1_link.png'), 'b/b1_link.png': (tarfile.SYMTYPE, './b1.png'),
        'README': (tarfile.SYMTYPE, 'a/a0.png')})
    ds = ImageFileDataset(str(ok))
    assert _labels(ds) == {'a0.png': 'a', 'a1.png': 'a', 'hard.png': 'a', 'b0.png': 'b', 'b1.png': 'b'}
    assert np.array_equal(np.asarray(ds[2][0]), np.asarray(_image(0)))  # a/hard.png: a/a0.png's data
    two = _tar_with_links(tmp_path / 'two.tar', images, {'b/stolen.png': (tarfile.SYMTYPE, '../a/a0.png')})
    with pytest.raises(UsageError, match='the image b/stolen.png is the same file as a/a0.png'):
        ImageFileDataset(str(two))
    for name, target, what in [('c', '/data/elsewhere/c', 'nothing inside the tar'),
                               ('a/more', '../b', 'a folder in the tar'),
                               ('a/x.png', 'x.png', 'nothing inside the tar')]:  # the last is a loop
        bad = _tar_with_links(tmp_path / 'bad.tar', images, {name: (tarfile.SYMTYPE, target)})
        with pytest.raises(UsageError, match=f'member {name} is a symlink to {target} \\({what}\\).*--dereference'):
            ImageFileDataset(str(bad))


def test_image_file_dataset_is_a_timm_image_dataset_that_never_replaces_a_sample(tmp_path):
    """The image folder / tar dataset is timm's ImageDataset over a timm Reader (timm's tools see its files), but an
    unreadable image is returned as itself skipped, never as the next sample (timm's ImageDataset retries the next
    index); a tar dataset pickles (loader workers) and reads the same after."""
    from timm.data import ImageDataset
    from timm.data.readers.reader import Reader
    _folder(tmp_path / 'train', {'a': 2, 'b': 1})
    (tmp_path / 'train' / 'a' / 'sub').mkdir()
    _image(7).save(tmp_path / 'train' / 'a' / 'sub' / 'deep.png')
    (tmp_path / 'train' / 'a' / 'broken.png').write_bytes(b'not an image')
    os.symlink(tmp_path / 'train' / 'b' / '2.png', tmp_path / 'train' / 'a' / 'linked.png')
    with pytest.raises(UsageError, match='same file as b/2.png'):  # one image, two classes
        ImageFileDataset(str(tmp_path / 'train'))
    os.remove(tmp_path / 'train' / 'a' / 'linked.png')
    ds = ImageFileDataset(str(tmp_path / 'train'))
    assert isinstance(ds, ImageDataset) and isinstance(ds.reader, Reader)
    assert ds.reader.filenames(basename=True) == ['0.png', '1.png', 'broken.png', 'deep.png', '2.png']
    assert [t for _, t in ds.samples] == [0, 0, 0, 0, 1]  # a/sub/deep.png is class a, not a class 'sub'
    broken = ds[2]
    assert isinstance(broken, SkippedImage) and broken.name == str(tmp_path / 'train' / 'a' / 'broken.png')
    tar = _tar(tmp_path / 'train.tar', {f'{c}/{i}.png': _png_bytes(_image(i)) for c in 'ab' for i in range(2)})
    ds = ImageFileDataset(str(tar))
    again = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(np.asarray(again[1][0]), np.asarray(ds[1][0]))


# ---------------------------------------------------------------------------------------------------- decoding


def _gradient16():
    return (np.arange(SIZE * SIZE, dtype=np.int64).reshape(SIZE, SIZE) * 1000 + 123).astype(np.uint16)


def _as_16bit_file(tmp_path, mode):
    """(a file that PIL opens in ``mode``, its 16-bit values)."""
    values = _gradient16()
    if mode == 'I;16':
        path = tmp_path / 'g16.png'
        Image.fromarray(values).save(path)
    elif mode == 'I;16B':
        path = tmp_path / 'g16b.tif'
        Image.frombytes('I;16B', (SIZE, SIZE), values.astype('>u2').tobytes()).save(path)
    else:  # 'I': 32-bit integers holding 16-bit values
        path = tmp_path / 'g32.tif'
        Image.fromarray(values.astype(np.int32)).save(path)
    return path, values


@pytest.mark.parametrize('mode', ['I;16', 'I;16B', 'I'])
def test_16bit_grayscale_is_scaled_not_clipped(tmp_path, mode):
    path, values = _as_16bit_file(tmp_path, mode)
    with Image.open(path) as img:
        assert img.mode == mode  # the test covers the mode it names
    expected = np.round(values / 257.).astype(np.uint8)
    rgb = np.asarray(load_image(path, 'RGB'))
    assert rgb.shape == (SIZE, SIZE, 3) and np.array_equal(rgb, np.repeat(expected[..., None], 3, axis=2))
    assert rgb.min() < 10 and 200 < rgb.max() < 255  # not all-white
    assert np.array_equal(np.asarray(load_image(path, 'L')), expected)


def test_other_pil_modes_convert_to_the_right_colours(tmp_path):
    red, green, blue = (255, 0, 0), (0, 255, 0), (0, 0, 255)
    # palette with a transparent entry: the palette colours
    pal = Image.new('P', (2, 1))
    pal.putpalette([*red, *green, *blue])
    pal.putpixel((0, 0), 0)
    pal.putpixel((1, 0), 2)
    pal.info['transparency'] = 0
    pal.save(tmp_path / 'p.png', transparency=0)
    assert np.array_equal(np.asarray(load_image(tmp_path / 'p.png')), np.array([[red, blue]], dtype=np.uint8))
    # gray + alpha: the gray (alpha dropped, as Image.convert)
    Image.fromarray(np.array([[[10, 0], [200, 255]]], dtype=np.uint8), 'LA').save(tmp_path / 'la.png')
    assert np.array_equal(np.asarray(load_image(tmp_path / 'la.png')), np.array([[[10] * 3, [200] * 3]], np.uint8))
    # CMYK (lossless TIFF): cyan + magenta... as RGB
    Image.new('CMYK', (1, 1), (0, 255, 255, 0)).save(tmp_path / 'cmyk.tif')
    assert np.asarray(load_image(tmp_path / 'cmyk.tif'))[0, 0].tolist() == list(red)
    # bilevel
    Image.fromarray(np.array([[0, 1]], dtype=bool)).save(tmp_path / 'one.png')
    assert np.asarray(load_image(tmp_path / 'one.png'))[0].tolist() == [[0] * 3, [255] * 3]
    # float in 0..1 scales to 0..255; premultiplied La is un-premultiplied first (100 / (128 / 255) = 199)
    f = Image.fromarray(np.array([[0., 0.5, 1.]], dtype=np.float32))
    assert np.asarray(convert_image_mode(f, 'L')).tolist() == [[0, 128, 255]]
    assert convert_image_mode(Image.new('La', (1, 1), (100, 128)), 'RGB').getpixel((0, 0)) == (199, 199, 199)


def _dataset_with_extension(root, ext):
    """The 'val' image dataset of ``root`` read with ``ext`` added to timm's image extensions (restored after)."""
    from timm.data import set_img_extensions, get_img_extensions
    before = get_img_extensions()
    set_img_extensions(before + (ext,))
    try:
        return create_image_dataset('', str(root), 'val')
    finally:
        set_img_extensions(before)


def test_image_modes_without_a_scale_are_refused_with_the_file_name(tmp_path):
    _folder(tmp_path / 'val', {'a': 1})
    Image.fromarray(np.array([[-5, 70000]], dtype=np.int32)).save(tmp_path / 'val' / 'a' / 'signed.tif')
    Image.fromarray(np.array([[0., 3.]], dtype=np.float32)).save(tmp_path / 'val' / 'a' / 'float.tif')
    ds = _dataset_with_extension(tmp_path, '.tif')
    skipped = {os.path.basename(s.name): s.reason for s in (ds[i] for i in range(len(ds)))
               if isinstance(s, SkippedImage)}
    assert set(skipped) == {'signed.tif', 'float.tif'}
    assert '0..65535' in skipped['signed.tif'] and 'only 0..1' in skipped['float.tif']



def test_multi_page_tiff_is_read_by_its_first_page_with_a_warning(tmp_path, caplog, monkeypatch):
    """Left out with a count by default (timm's extensions; test_bounds.py); with .tiff added, a 3-page scan is one
    sample, its first page, and the first such file is named once with its page count."""
    import mlp_vision.image_data as image_data
    _folder(tmp_path / 'val', {'a': 1})
    pages = [Image.new('RGB', (4, 4), colour) for colour in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    pages[0].save(tmp_path / 'val' / 'a' / 'p1.tiff', save_all=True, append_images=pages[1:])
    pages[1].save(tmp_path / 'val' / 'a' / 'p2.tiff', save_all=True, append_images=pages[2:])
    ds = _dataset_with_extension(tmp_path, '.tiff')
    monkeypatch.setattr(image_data, '_said_first_frame', False)
    with caplog.at_level(logging.WARNING):
        images = {os.path.basename(ds.filename(i)): ds[i][0] for i in range(len(ds))}
    assert set(images) == {'0.png', 'p1.tiff', 'p2.tiff'}
    assert images['p1.tiff'].getpixel((0, 0)) == (255, 0, 0) and images['p2.tiff'].getpixel((0, 0)) == (0, 255, 0)
    said = [r.getMessage() for r in caplog.records if 'frames (pages)' in r.getMessage()]
    assert said == [f'{tmp_path / "val" / "a" / "p1.tiff"} holds 3 frames (pages); only the first is read, as for '
                    f'every multi-frame image of this dataset (said once): save the pages as separate files to use '
                    f'them all']


# ---------------------------------------------------------------------------------------------------- unreadable


def _val_with_bad_images(root):
    """root/val with 8 good images in 2 classes and 3 bad ones (11: two ranks get unequal shares); returns the
    names of the bad ones."""
    _folder(root / 'val', {'a': 5, 'b': 3})
    (root / 'val' / 'a' / 'random.png').write_bytes(np.random.default_rng(0).bytes(300))
    (root / 'val' / 'b' / 'truncated.png').write_bytes(_png_bytes(_image(99))[:60])
    Image.new('RGB', (64, 64)).save(root / 'val' / 'b' / 'bomb.png')
    return {'random.png', 'truncated.png', 'bomb.png'}


class _MeanColour(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(self.pool(x).flatten(1))


def _approx_or_none(value):
    """``value`` to compare a metric with: None as itself (top-5 of fewer than 5 classes; pytest >= 9.2 refuses
    ``approx(None)``), a number to 1e-6 relative."""
    return None if value is None else pytest.approx(value, rel=1e-6)


@pytest.mark.parametrize('num_workers', [0, 2])
def test_unreadable_images_are_skipped_counted_and_excluded_from_metrics(tmp_path, monkeypatch, caplog, num_workers):
    """A corrupt file, a truncated PNG and a decompression bomb (PIL's pixel limit lowered to 2,000 so a
    64x64 image exceeds it twice) are left out with a warning naming each, counted, and not replaced: the
    metrics equal those of the same folder without them."""
    monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 2000)
    bad = _val_with_bad_images(tmp_path / 'with_bad')
    _folder(tmp_path / 'clean' / 'val', {'a': 5, 'b': 3})
    torch.manual_seed(0)
    model = _MeanColour()

    def run(root):
        ds = create_image_dataset('', str(root), 'val')
        loader = create_eval_loader(ds, DATA_CONFIG, 3, CPU, num_workers=num_workers)
        metrics = validate(model, loader, log_interval=0)
        return ds, loader, metrics

    with caplog.at_level(logging.WARNING):
        ds, loader, metrics = run(tmp_path / 'with_bad')
        targets = [t for _, tgt in loader for t in tgt.tolist()]  # a second pass: warned only once per file
    _, clean_loader, reference = run(tmp_path / 'clean')
    assert len(ds) == 11 and metrics['samples'] == 8 and loader.skipped == 3
    assert sorted(targets) == [0] * 5 + [1] * 3  # each readable image once
    for key in ('loss', 'top1', 'top5', 'samples'):
        assert metrics[key] == _approx_or_none(reference[key])
    assert {os.path.basename(n) for n in loader.skipped_files} == bad
    warned = [r.getMessage() for r in caplog.records if 'skipped unreadable image' in r.getMessage()]
    assert len(warned) == 3 and all(any(b in m for m in warned) for b in bad)
    assert any('DecompressionBomb' in m for m in warned)


def test_decompression_bomb_warning_range_is_skipped_too(tmp_path, monkeypatch):
    """Between 1x and 2x PIL's limit PIL only warns; the image is still not decoded."""
    monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 3000)
    Image.new('RGB', (64, 64)).save(tmp_path / 'big.png')  # 4,096 pixels
    with pytest.raises(Image.DecompressionBombWarning):
        load_image(tmp_path / 'big.png')


def test_train_loader_leaves_unreadable_images_out(tmp_path):
    _folder(tmp_path / 'train', {'a': 3, 'b': 2})
    (tmp_path / 'train' / 'a' / 'broken.png').write_bytes(b'not an image')
    ds = create_image_dataset('', str(tmp_path), 'train', is_training=True)
    loader, sampler = create_train_loader(ds, DATA_CONFIG, 1, CPU, num_workers=0)
    sampler.set_epoch(0)
    batches = list(loader)
    assert len(batches) == 5 and loader.skipped == 1  # 6 samples of batch 1: the empty batch left out
    assert sorted(int(t) for _, t in batches) == [0, 0, 0, 1, 1]
    # with several processes a batch of only unreadable images cannot be left out (the ranks would desync)
    for c in 'ab':
        (tmp_path / 'bad' / c).mkdir(parents=True)
        (tmp_path / 'bad' / c / 'broken.png').write_bytes(b'not an image')
    ds = create_image_dataset('', str(tmp_path / 'bad'), 'train', is_training=True)
    loader, sampler = create_train_loader(ds, DATA_CONFIG, 1, CPU, num_workers=0, rank=0, world_size=2)
    sampler.set_epoch(0)
    with pytest.raises(UsageError, match='1 of the 1 images of batch 0 were unreadable'):
        list(loader)


def _epoch_indices(loader, sampler, epoch):
    """The dataset indices of an epoch's batches (the batch sampler yields (augmentation seed, index))."""
    sampler.set_epoch(epoch)
    return [index for batch in loader.loader.batch_sampler for _, index in batch]


def test_train_loader_warns_how_many_images_full_batches_leave_out(tmp_path, caplog):
    """10 images, batch 4: full batches only, so 2 images sit out every epoch (issue 36: 64 of 120 photos trained
    silently); the warning's count equals the images the loader's batches really leave out, and names a batch
    size that leaves none out. Batch 5 uses every image: no warning."""
    _folder(tmp_path / 'train', {'a': 5, 'b': 5})
    ds = create_image_dataset('', str(tmp_path), 'train', is_training=True)
    with caplog.at_level(logging.WARNING):
        loader, sampler = create_train_loader(ds, DATA_CONFIG, 4, CPU, num_workers=0)
    used = _epoch_indices(loader, sampler, 0)
    assert len(used) == 8 and len(set(used)) == 8  # two batches of 4 distinct images
    assert len(ds) - len(set(used)) == 2
    assert ('2 of the 10 training images (20 %) are unused in every epoch: the training loader keeps full batches '
            'only (10 images = 2 x batch 4 + 2 dropped') in caplog.text
    assert '--batch-size 5 leaves none out' in caplog.text
    assert set(_epoch_indices(loader, sampler, 1)) != set(used)  # shuffled: another pair sits out next epoch
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        loader, sampler = create_train_loader(ds, DATA_CONFIG, 5, CPU, num_workers=0)
    assert 'unused' not in caplog.text and sorted(_epoch_indices(loader, sampler, 0)) == list(range(10))


@pytest.mark.parametrize('num_images, batch, world, repeats, unused', [
    (120, 64, 1, 0, 56), (120, 60, 1, 0, 0), (120, 32, 1, 0, 24), (10, 3, 2, 0, 4), (3000, 32, 1, 3, 2062)])
def test_unused_images_count_matches_the_sampler(num_images, batch, world, repeats, unused):
    """The count of the warning equals the distinct images the samplers of all ranks hand to full batches (timm's
    RepeatAugSampler with --aug-repeats), computed by running them."""
    ds = torch.utils.data.TensorDataset(torch.arange(num_images))
    per_rank = train_samples_per_rank(ds, world, repeats)
    seen = set()
    for rank in range(world):
        sampler = create_train_sampler(ds, world, rank, 0, repeats)
        assert len(sampler) == per_rank
        indices = list(sampler)
        seen.update(indices[:len(indices) // batch * batch])
    message = unused_images_message(num_images, per_rank, batch, world, repeats)
    if repeats:  # the sampler repeats each image: the message says "about" its share of distinct images
        assert message.startswith(f'{unused:,} of the {num_images:,}')
        assert abs((num_images - len(seen)) - unused) <= 0.1 * num_images
    elif unused:
        assert num_images - len(seen) == unused and message.startswith(f'{unused} of the {num_images} ')
    else:
        assert len(seen) == num_images and message is None


def test_batch_larger_than_the_training_set_is_fitted_to_it(caplog):
    """A training set smaller than one batch trains in one batch of all its images (said in a warning), rounded
    down to even for mixup; no sample at all (RepeatAugSampler on fewer than 256 images over many ranks) stops."""
    with caplog.at_level(logging.WARNING):
        assert fit_batch_to_data(32, 120) == 32 and not caplog.text
        assert fit_batch_to_data(64, 50) == 50
    assert '--batch-size 64 is more than the 50 training images each process draws per epoch' in caplog.text
    assert 'training with batch 50, one update per epoch' in caplog.text
    assert fit_batch_to_data(64, 51, even=True) == 50
    with pytest.raises(UsageError, match='draws 0 image.s. per process and epoch: too few to train on'):
        fit_batch_to_data(8, 0)


def test_dataset_source_names_folder_or_tar(tmp_path):
    """The training log names what was read: the folder or the tar the split was found as (issue 36: it said
    "(train.tar)" for a folder), and a hold-out as part of it."""
    _folder(tmp_path / 'f' / 'train', {'a': 2, 'b': 2})
    (tmp_path / 't').mkdir()
    _tar(tmp_path / 't' / 'train.tar', {f'{c}/{i}.png': _png_bytes(_image(i)) for c in 'ab' for i in range(2)})
    folder = create_image_dataset('', str(tmp_path / 'f'), 'train.tar')  # asked for a tar, found the folder
    tar = create_image_dataset('', str(tmp_path / 't'), 'train')  # asked for 'train', found train.tar
    assert dataset_source(folder) == f'folder {tmp_path / "f" / "train"}'
    assert dataset_source(tar) == f'tar {tmp_path / "t" / "train.tar"}'
    train, val = create_train_val_datasets('', str(tmp_path / 'f'), val_split=0.5)
    assert dataset_source(train) == dataset_source(val) == f'part of the folder {tmp_path / "f" / "train"}'
    assert dataset_source(torch.utils.data.TensorDataset(torch.zeros(2))) is None


def test_a_hold_out_says_which_validation_folder_it_leaves_unused(tmp_path, caplog):
    """--val-split FRACTION beside a val/ folder validates on the hold-out, and a warning names the folder left
    unused (a user who made val/ would otherwise not learn it was ignored); without val/ there is no warning."""
    _folder(tmp_path / 'f' / 'train', {'a': 4, 'b': 4})
    with caplog.at_level(logging.WARNING):
        create_train_val_datasets('', str(tmp_path / 'f'), val_split=0.5)
    assert 'is not used' not in caplog.text
    _folder(tmp_path / 'f' / 'val', {'a': 1, 'b': 1})
    with caplog.at_level(logging.WARNING):
        train, val = create_train_val_datasets('', str(tmp_path / 'f'), val_split=0.5)
    assert f'the validation split {tmp_path / "f" / "val"} is not used' in caplog.text
    assert (len(train), len(val)) == (4, 4)

def test_digits_demo_folder_reads(tmp_path):
    pytest.importorskip('sklearn')
    from mlp_vision.image_data import prepare_digits_folder
    root = prepare_digits_folder(tmp_path / 'digits', size=16, max_per_class=5)
    train, val = create_train_val_datasets('', str(root), 'train', 'val')
    assert (len(train), len(val)) == (40, 10)  # every 5th image of a class is val
    assert dataset_class_names(train) == [str(d) for d in range(10)]
    assert isinstance(train, ImageFileDataset) and train[0][0].mode == 'RGB'


def _evaluate_rank(rank, world_size, root, port, out):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = _MeanColour()
        ds = create_image_dataset('', root, 'val')
        loader = create_eval_loader(ds, DATA_CONFIG, 2, CPU, num_workers=0, distributed=True)
        metrics = validate(model, loader, distributed=True, log_interval=0)
        torch.save({'metrics': dict(metrics), 'skipped': loader.skipped}, f'{out}.{rank}')
    finally:
        dist.destroy_process_group()


def test_distributed_evaluation_counts_each_readable_image_once(tmp_path, monkeypatch):
    """Two gloo ranks on a folder with unreadable images give the metrics of one process on the clean folder
    (no padding duplicates, no skipped image counted), and the ranks' skip counts add up."""
    import socket
    import torch.multiprocessing as mp
    monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 2000)
    _val_with_bad_images(tmp_path / 'with_bad')
    _folder(tmp_path / 'clean' / 'val', {'a': 5, 'b': 3})
    torch.manual_seed(0)
    reference = validate(_MeanColour(), create_eval_loader(
        create_image_dataset('', str(tmp_path / 'clean'), 'val'), DATA_CONFIG, 2, CPU, num_workers=0), log_interval=0)
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    out = str(tmp_path / 'rank')
    mp.start_processes(_evaluate_rank, args=(2, str(tmp_path / 'with_bad'), port, out), nprocs=2,
                       start_method='fork')
    results = [torch.load(f'{out}.{r}', weights_only=True) for r in range(2)]
    for r in results:
        for key in ('loss', 'top1', 'top5', 'samples'):
            assert r['metrics'][key] == _approx_or_none(reference[key])
    assert sum(r['skipped'] for r in results) == 3


def test_class_maps_are_text_and_never_unpickled(tmp_path):
    """--class-map: one class name a line (timm's .txt format); a pickled map (timm unpickles .pkl) is refused
    before it is opened, through the library path too, and a map that cannot label uniquely is one line."""
    import pickle
    marker = tmp_path / 'ran'

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), 'w'))
    (tmp_path / 'map.pkl').write_bytes(pickle.dumps(Payload()))
    for cls in ('a', 'b'):
        (tmp_path / 'data' / cls).mkdir(parents=True)
    with pytest.raises(UsageError, match='is a pickle'):
        ImageFileDataset(str(tmp_path / 'data'), class_map=str(tmp_path / 'map.pkl'))
    assert not marker.exists()
    (tmp_path / 'map.txt').write_text('b\na\n\n')
    assert read_class_map(str(tmp_path / 'map.txt')) == {'b': 0, 'a': 1}
    assert read_class_map('map.txt', root=str(tmp_path)) == {'b': 0, 'a': 1}  # found under the data root
    for text, problem in (('a\n\nb\n', 'has a blank line'), ('a\na\n', 'names a class twice'), ('\n', 'names no class')):
        (tmp_path / 'bad.txt').write_text(text)
        with pytest.raises(UsageError, match=problem):
            read_class_map(str(tmp_path / 'bad.txt'))


def test_posterize_to_zero_bits_is_a_black_image_in_the_training_pipeline(tmp_path):
    """timm's RandAugment asks for 0 bits at magnitude 10 (``rand-m9-mstd0.5-inc1``): recent Pillow raises there,
    which would kill a run at a random step; the training loader's transform gives the black image of TF and older
    Pillow, and leaves every other bit count to timm / Pillow."""
    from PIL import ImageOps
    from timm.data.auto_augment import AugmentOp
    _folder(tmp_path / 'train', {'a': 2, 'b': 2})
    dataset = create_image_dataset('', str(tmp_path), 'train')
    create_train_loader(dataset, DATA_CONFIG, 2, CPU, num_workers=0, auto_augment='rand-m10-mstd0-n1-inc1')
    rand_augment = next(t for t in dataset.transform.transforms if hasattr(t, 'ops'))
    posterize = next(op for op in rand_augment.ops if op.name == 'PosterizeIncreasing')
    posterize.prob = 1.
    img = Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3) * 5)
    black = posterize(img)
    assert black.size == img.size and np.asarray(black).max() == 0
    three_bits = AugmentOp('PosterizeIncreasing', prob=1., magnitude=2.5, hparams={'magnitude_std': 0})
    three_bits.aug_fn = posterize.aug_fn
    assert np.array_equal(np.asarray(three_bits(img)), np.asarray(ImageOps.posterize(img, 3)))


def test_importing_mlp_vision_leaves_timm_augment_ops_as_they_are():
    """No global state: timm's table of augmentation ops is the same after ``import mlp_vision`` (and building a
    training loader) as in a fresh timm."""
    script = ('from timm.data import auto_augment as a; fresh = dict(a.NAME_TO_OP); import mlp_vision, '
              'mlp_vision.train; from mlp_vision import image_data; '
              'print(all(a.NAME_TO_OP[k] is f for k, f in fresh.items()) and fresh.keys() == a.NAME_TO_OP.keys())')
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, 'PYTHONPATH': REPO}, check=True).stdout
    assert out.strip().splitlines()[-1] == 'True'


# ------------------------------------------------------------------------------------- a class left with no image
def _train_main(argv):
    import mlp_vision.train as train
    from _helpers import TINY_VISION
    return train.main(TINY_VISION + ['--threads', '1'] + argv)


def test_a_class_with_no_training_image_is_a_usage_error_before_anything_is_built(tmp_path, capsys):
    """A class map naming a class with no folder: an output nothing trains, known before training, so one line
    (exit 2) and no run folder. A --val-split hold-out never empties a class: a one-image class stays in training."""
    from _helpers import exits_with_one_line
    _folder(tmp_path / 'data' / 'train', {'a': 3, 'b': 3})
    (tmp_path / 'map.txt').write_text('a\nb\nc\n')
    with pytest.raises(UsageError, match=r'the training set has no image of class\(es\) \[c\]: nothing would train'):
        create_train_val_datasets('', str(tmp_path / 'data'), 'train', '', class_map=str(tmp_path / 'map.txt'))
    line = exits_with_one_line(_train_main, ['--data-dir', str(tmp_path / 'data'), '--val-split', '', '--class-map',
                                             str(tmp_path / 'map.txt'), '--output', str(tmp_path / 'out')], capsys)
    assert 'no image of class(es) [c]' in line and not (tmp_path / 'out').exists()
    _folder(tmp_path / 'one' / 'train', {'a': 6, 'b': 1})
    train, val = create_train_val_datasets('', str(tmp_path / 'one'), 'train', 0.5, seed=3)
    assert Counter(t for _, t in (train.dataset.samples[i] for i in train.indices)) == {0: 3, 1: 1}
    assert len(val) == 3


def _class_of_corrupt_files(root, good, corrupt):
    """root/train: class a of readable images, class b of files that are no image."""
    _folder(root / 'train', {'a': good})
    (root / 'train' / 'b').mkdir(parents=True)
    for i in range(corrupt):
        (root / 'train' / 'b' / f'{i}.png').write_bytes(b'not an image %d' % i)


def test_a_class_whose_every_image_is_unusable_stops_at_the_end_of_the_epoch(tmp_path, capsys):
    """Every image of class b unreadable: the run trained on class a only without a word; now the epoch's
    reading ends in one line (exit 1) naming the class and its count, and saying no checkpoint of it was written."""
    from _helpers import exits_with_one_line
    _class_of_corrupt_files(tmp_path / 'data', good=8, corrupt=2)  # batches of 4 keep 2 images or more (BatchNorm)
    ds = create_image_dataset('', str(tmp_path / 'data'), 'train', is_training=True)
    loader, sampler = create_train_loader(ds, DATA_CONFIG, 4, CPU, num_workers=0)
    sampler.set_epoch(0)
    with pytest.raises(RunError, match=r'no training image of class\(es\) b \(all 2 images unusable\) could be '):
        list(loader)
    line = exits_with_one_line(_train_main, ['--data-dir', str(tmp_path / 'data'), '--val-split', '', '--epochs', '2',
                                             '-b', '4', '--output', str(tmp_path / 'out'), '--experiment', 'e'],
                               capsys, status=1)
    assert 'b (all 2 images unusable)' in line and 'before its checkpoint was written' in line
    assert not (tmp_path / 'out' / 'e' / 'last.pth').exists()


def test_a_class_with_a_readable_image_the_epoch_did_not_draw_trains_on(tmp_path):
    """Class b: one unreadable and one readable image; with full batches only one of 3 images sits out each epoch.
    An epoch that drew only b's unreadable image goes on: b's other image is read to tell."""
    _class_of_corrupt_files(tmp_path, good=1, corrupt=1)
    _folder(tmp_path / 'train', {'b': 1}, start=10)
    ds = create_image_dataset('', str(tmp_path), 'train', is_training=True)
    loader, sampler = create_train_loader(ds, DATA_CONFIG, 2, CPU, num_workers=0)
    only_unreadable_b = 0
    for epoch in range(12):
        sampler.set_epoch(epoch)
        targets = [t for _, target in loader for t in target.tolist()]
        only_unreadable_b += loader.skipped == 1 and 1 not in targets
    assert only_unreadable_b > 0


@pytest.mark.parametrize('accumulate', ['1', '2'])
def test_batches_left_short_by_unreadable_images_are_left_out_and_training_ends_normally(tmp_path, caplog, accumulate):
    """Batches of 2 in which unreadable files left one image (a batch of one is no BatchNorm training batch: it was
    a ValueError traceback) or none (the loader leaves such batches out, so the epoch ended before len(loader)
    batches: a StopIteration traceback): each is left out with a warning, the epoch's last update is the last batch
    that came, and the run ends with its checkpoints, with and without accumulation."""
    for c in 'ab':
        _folder(tmp_path / 'data' / 'train', {c: 3}, start=10 * (c == 'b'))
        for i in range(3):
            (tmp_path / 'data' / 'train' / c / f'bad{i}.png').write_bytes(b'not an image %d' % i)
        _folder(tmp_path / 'data' / 'val', {c: 2})
    caplog.set_level('WARNING')
    results = _train_main(['--data-dir', str(tmp_path / 'data'), '--epochs', '2', '-b', '2', '--grad-accum-steps',
                           accumulate, '--seed', '3', '--output', str(tmp_path / 'out')])
    assert results['best']['epoch'] in (0, 1)
    assert [p.name for p in sorted((tmp_path / 'out').glob('*/checkpoint-*.pth'))] == ['checkpoint-0.pth',
                                                                                       'checkpoint-1.pth']
    assert any('readable image(s) of 2: left out, too few to train on' in r.getMessage() for r in caplog.records)


def test_min_lr_above_the_learning_rate_from_lr_base_is_one_line(tmp_path, capsys):
    """No --lr: the LR is --lr-base scaled to the batch, known only then; a --min-lr above it would make the cosine
    rise. One line before the run folder is made."""
    from _helpers import exits_with_one_line
    _folder(tmp_path / 'data' / 'train', {'a': 2, 'b': 2})
    line = exits_with_one_line(_train_main, ['--data-dir', str(tmp_path / 'data'), '--val-split', '0.5', '--min-lr',
                                             '5', '--output', str(tmp_path / 'out')], capsys)
    assert re.search(r'--min-lr 5 is above the learning rate [0-9.e-]+ \(from --lr-base\)', line), line
    assert not (tmp_path / 'out').exists()


# ------------------------------------------------------------------------------------- signals to the process group
def _worker_signals(img):
    """In place of an image: (SIGINT ignored, SIGTERM's handler is the loader's) in the process that reads it."""
    import signal
    from mlp_vision import image_data
    return torch.tensor([[[signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
                           signal.getsignal(signal.SIGTERM) == image_data._end_on_the_next_sigterm]]],
                        dtype=torch.uint8)


def test_loader_workers_ignore_sigint_and_the_first_sigterm(tmp_path):
    """Ctrl-C and `timeout` signal the whole process group; a worker killed first ended the run in a 40-line
    DataLoader traceback. The workers ignore SIGINT and a first SIGTERM (the main process stops at a step boundary
    and ends them); a second SIGTERM ends a worker, as the main process's own terminate must."""
    import signal
    _folder(tmp_path / 'val', {'a': 2})
    ds = create_image_dataset('', str(tmp_path), 'val')
    loader = create_eval_loader(ds, DATA_CONFIG, 2, CPU, num_workers=2)
    ds.transform = _worker_signals
    flags = [f.tolist() for input, _ in loader.loader for f in input]
    assert flags == [[[[1, 1]]]] * 2
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # not in this process


def test_an_error_after_evaluation_ends_the_command_with_its_workers(images, tmp_path):
    """An error raised after the loader's last batch (here: a results file that cannot be made) frees the loader
    only at exit, when its workers are ended with SIGTERM: the command must end with its one line, not wait on
    them forever."""
    model = tmp_path / 'model'
    import timm
    from timm.models import save_for_hf
    save_for_hf(timm.create_model('smlpnet_t', embed_dim=8, depths=(1, 1, 1, 1), img_size=32, num_classes=2),
                str(model), model_config={'label_names': ['class0', 'class1']}, safe_serialization=True,
                data_config=dict(input_size=(3, 32, 32), interpolation='bicubic', mean=(0.5,) * 3, std=(0.25,) * 3,
                                 crop_pct=1.0, crop_mode='center'))
    env = {**os.environ, 'PYTHONPATH': REPO, 'OMP_NUM_THREADS': '1'}
    argv = [sys.executable, '-m', 'mlp_vision.validate', str(images / 'val'), '--model', f'local-dir:{model}',
            '--pretrained', '--workers', '2', '--threads', '1', '--results-file', str(tmp_path / 'no' / 'r.json')]
    with open(tmp_path / 'out.txt', 'w') as out:  # output to a file, as a user's log
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, timeout=240)
    lines = (tmp_path / 'out.txt').read_text().strip().splitlines()
    assert proc.returncode == 1 and lines[-1].endswith(f'No such file or directory: {tmp_path / "no" / "r.json"}')


@pytest.mark.slow
@pytest.mark.parametrize('signum', ['SIGTERM', 'SIGINT'])
def test_a_signal_to_the_process_group_gives_the_documented_stop_line(images, tmp_path, signum):
    """`timeout 60 python train.py --workers 2 ...` sends SIGTERM to the whole group: exit 128 + signal and the one
    documented line naming last.pth, no traceback."""
    import signal
    from _helpers import TINY_VISION
    signum = getattr(signal, signum)
    argv = [a if a != '0' or TINY_VISION[i - 1] != '--workers' else '2' for i, a in enumerate(TINY_VISION)]
    argv += ['--data-dir', str(images), '--val-split', 'val', '--epochs', '2', '--log-interval', '1', '--threads', '1',
             '--output', str(tmp_path), '--experiment', 'g']
    env = {**os.environ, 'PYTHONPATH': REPO, 'PYTHONUNBUFFERED': '1', 'OMP_NUM_THREADS': '1'}
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, 'train.py')] + argv, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith('Train: 1/1 [1/'):  # epoch 1 under way, epoch 0 checkpointed
                os.killpg(proc.pid, signum)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    last = tmp_path / 'g' / 'last.pth'
    assert proc.returncode == 128 + signum, err
    assert 'Traceback' not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f'train.py: error: interrupted by {signal.Signals(signum).name} at epoch 1, batch ')
    assert err.strip().endswith(f'the resumable checkpoint is {last} (epoch 0): continue with --resume {last}')
