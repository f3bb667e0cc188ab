""" Bad input to the text side (issue 29 item 4): every flag value of ``mlp_vision.train_text`` (causal / mlm /
classify) is checked before work starts, and a damaged or inconsistent saved folder (``--init-from``,
``--tokenizer-from``, ``from_pretrained``) is one line naming the file:
exit status 2 and exactly that line on stderr, no traceback; library calls raise ``UsageError`` (a ``ValueError``).

Everything runs on data made here: a generated text, a small labelled CSV, a tiny masked LM saved with
``save_pretrained`` and corrupted copies of it.
"""
import json
import logging
import math
import random
import re
import shutil

import pytest
import torch

import mlp_vision.text as mt
import mlp_vision.train_text as text_train
from mlp_vision.text.labelled_data import read_labelled_file
from mlp_vision.text.training_data import build_tokenizer
from mlp_vision.arguments import check_range
from mlp_vision.errors import UsageError
from _helpers import exits_with_one_line

TINY_GPT = ['--model', 'gpt_mlp_attention', '--model-kwargs', 'num_hidden_layers=1', 'hidden_size=16',
            'num_attention_heads=2', 'max_position_embeddings=16', 'mlp_attention_hidden_size=16', '--threads', '1',
            '--log-interval', '1000', '-b', '2', '--steps', '2']
WORDS = 'to be or not that is the question whether tis nobler in mind suffer slings arrows'.split()


_fail = exits_with_one_line


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """A text file, a labelled train / dev CSV, and saved masked LMs: byte tokenizer (``good``), trained WordPiece
    (``subword``)."""
    root = tmp_path_factory.mktemp('text_inputs')
    rng = random.Random(0)
    text = '\n'.join(' '.join(rng.choice(WORDS) for _ in range(8)) for _ in range(150)) + '\n'
    (root / 'tiny.txt').write_text(text)
    rows = ''.join(f'"{rng.choice(WORDS)} {rng.choice(WORDS)}",{i % 2}\n' for i in range(12))
    for name in ('train.csv', 'dev.csv'):
        (root / name).write_text('sentence,label\n' + rows)
    torch.manual_seed(0)
    kwargs = dict(num_hidden_layers=1, hidden_size=16, intermediate_size=32, tiny_attention_size=8,
                  max_position_embeddings=32)
    byte = mt.byte_tokenizer()
    mt.create_model('amlp_base', vocab_size=byte.vocab_size, **kwargs).save_pretrained(str(root / 'good'), tokenizer=byte)
    sub = mt.train_tokenizer(texts=text.splitlines(), vocab_size=60)
    mt.create_model('amlp_base', vocab_size=sub.vocab_size, **kwargs).save_pretrained(str(root / 'subword'), tokenizer=sub)
    mt.create_model('amlp_base', vocab_size=300, **kwargs).save_pretrained(str(root / 'vocab300'), tokenizer=byte)
    return root


# ------------------------------------------------------------------------------------------------ trainer flags
TRAINER_FLAGS = {
    ('--seed', '-1'): '--seed must be in [0, 2147483647], got -1',
    ('--seed', str(2 ** 70)): '--seed must be in [0, 2147483647]',
    ('--threads', '0'): '--threads must be in [1, ',
    ('--threads', '100000'): '(the CPUs this process may use), got 100000',  # torch.set_num_threads(100000): SIGSEGV
    ('--device', 'banana'): "argument --device: invalid choice: 'banana'",
    ('--weight-decay', '-1'): '--weight-decay must be >= 0, got -1.0',
    ('--opt-betas', '1.5', '0.9'): '--opt-betas must be in [0, 1), got 1.5',
    ('--opt-betas', '0.9', 'nan'): '--opt-betas must be in [0, 1), got nan',
    ('--opt-eps', '0'): '--opt-eps must be a positive number, got 0.0',
    ('--lr', 'inf'): '--lr must be a positive number, got inf',
    ('--clip-grad', 'nan'): '--clip-grad must be a finite number (<= 0: no clipping), got nan',
    ('--warmup-steps', '-1'): '--warmup-steps must be in [0, ',
    ('--steps', '10', '--warmup-steps', '10'): '--warmup-steps must be in [0, 9] (below --steps: a run all warmup never '
                                               'reaches --lr), got 10',
    ('--max-params', '0.5'): '--max-params must be >= 1 (a parameter count), got 0.5',
    ('--block-size', '0'): '--block-size must be >= 1 (--task causal), got 0',
    ('--block-size', '100'): "--block-size 100 is larger than the model's maximum length 16",
    ('--task', 'mlm', '--model', 'amlp_base', '--block-size', '2'): '--block-size must be >= 3 (--task mlm), got 2',
    ('--vocab-size', '-5'): '--vocab-size must be >= 1, got -5',
    ('--tokenizer', 'wordpiece', '--vocab-size', '5'): '--vocab-size must be >= 6 (room for text tokens',
    ('--tokenizer', 'bpe', '--vocab-size', '200'): '--vocab-size must be >= 262 (byte-level BPE keeps the 256 bytes',
    ('--mask-rate', '0'): '--mask-rate must be in (0, 1), got 0.0',
    ('--mask-rate', '1.5'): '--mask-rate must be in (0, 1), got 1.5',
    ('--val-fraction', 'nan'): '--val-fraction must be in (0, 1), got nan',
    ('--eval-batch-size', '0'): '--eval-batch-size must be in [1, 65536]',
    ('--init-from', 'x'): '--init-from is for --task classify, not --task causal',
    ('--test-file', 'x', '--text-columns', 'a'): '--test-file, --text-columns are for --task classify',
    ('--model-kwargs', 'hidden_dropout_prob=1.5'): 'GPTConfig.hidden_dropout_prob must be in [0, 1), got 1.5',
}
if not torch.cuda.is_available():
    TRAINER_FLAGS[('--device', 'cuda')] = '--device cuda: this machine has no CUDA device; use --device cpu'


@pytest.mark.parametrize('flags', list(TRAINER_FLAGS), ids=' '.join)
def test_trainer_flag_values_are_checked_up_front(flags, data, tmp_path, capsys):
    argv = TINY_GPT + ['--train-file', str(data / 'tiny.txt'), '--output', str(tmp_path)] + list(flags)
    msg = _fail(text_train.main, argv, capsys)
    assert msg.startswith('python -m mlp_vision.train_text: error: ') and TRAINER_FLAGS[flags] in msg, msg
    assert not any(tmp_path.iterdir())  # refused before a run folder was made


CLASSIFY = ['--task', 'classify', '--model', 'gmlp_base', '--model-kwargs', 'num_hidden_layers=1', 'hidden_size=16',
            'intermediate_size=32', 'max_position_embeddings=32', '--threads', '1', '--steps', '2', '-b', '2',
            '--log-interval', '1000']
CLASSIFY_COLUMNS = {
    ('--text-columns', 'label'): "--label-column 'label' is also a text column (label): the model would read the "
                                 "answer",
    ('--label-column', 'sentence'): "--label-column 'sentence' is also a text column (sentence)",
    ('--text-columns', 'sentence,sentence'): "--text-columns names 'sentence' twice",
}


@pytest.mark.parametrize('flags', list(CLASSIFY_COLUMNS), ids=' '.join)
def test_classify_refuses_columns_that_cannot_give_a_right_answer(flags, data, tmp_path, capsys):
    argv = CLASSIFY + ['--train-file', str(data / 'train.csv'), '--val-file', str(data / 'dev.csv'), '--output',
                       str(tmp_path)] + list(flags)
    assert CLASSIFY_COLUMNS[flags] in _fail(text_train.main, argv, capsys)


# ------------------------------------------------------------------------------------------------ saved folders
def _edit_config(path, **fields):
    payload = json.loads((path / 'config.json').read_text())
    payload.update(fields)  # transformers' flat config.json
    (path / 'config.json').write_text(json.dumps(payload))


def _truncate(path, keep):
    path.write_bytes(path.read_bytes()[:keep])


# name -> (saved folder to copy, corruption, what the one line must say)
DAMAGE = {
    'hidden_size edited': ('good', lambda p: _edit_config(p, hidden_size=32),
                           'model.safetensors does not fit'),
    'vocab_size edited': ('good', lambda p: _edit_config(p, vocab_size=300), 'vocab_size 300'),
    'layer_norm_eps NaN': ('good', lambda p: (p / 'config.json').write_text(
        (p / 'config.json').read_text().replace('1e-06', 'NaN')),
        'config.json: GMLPConfig.layer_norm_eps must be a positive number, got nan'),
    'truncated config.json': ('good', lambda p: _truncate(p / 'config.json', 30), 'config.json is not valid JSON'),
    'empty model.safetensors': ('good', lambda p: (p / 'model.safetensors').write_bytes(b''),
                                'model.safetensors is not a readable safetensors file'),
    'config without weights': ('good', lambda p: (p / 'model.safetensors').unlink(),
                               'model.safetensors does not exist'),
    'truncated tokenizer_config.json': ('good', lambda p: _truncate(p / 'tokenizer_config.json', 12),
                                        'tokenizer_config.json is not a tokenizer file'),
    'truncated tokenizer.json': ('subword', lambda p: _truncate(p / 'tokenizer.json', 100),
                                 'tokenizer.json is not a tokenizer file'),
    'tokenizer.json of another kind': ('subword', lambda p: (p / 'tokenizer.json').write_text(
        '{"type": "banana", "model": 3}'), 'tokenizer.json is not a tokenizer file'),
    'vocab.txt of random bytes': ('subword', lambda p: ((p / 'tokenizer.json').unlink(), (p / 'vocab.txt').write_bytes(
        bytes(random.Random(0).randrange(128, 256) for _ in range(300)))), 'vocab.txt is not a tokenizer file'),
    'model vocabulary larger than the tokenizer': ('vocab300', lambda p: None,
                                                   'the model has vocab_size 300 but its tokenizer has 260 tokens'),
}


@pytest.fixture
def damaged(data, tmp_path, request):
    base, corrupt, _ = DAMAGE[request.param]
    folder = tmp_path / 'damaged'
    shutil.copytree(data / base, folder)
    corrupt(folder)
    return folder


@pytest.mark.parametrize('damaged', list(DAMAGE), indirect=True)
def test_damaged_folder_given_to_init_from(damaged, data, tmp_path, capsys, request):
    expected = DAMAGE[request.node.callspec.params['damaged']][2]
    argv = ['--task', 'classify', '--init-from', str(damaged), '--train-file', str(data / 'train.csv'),
            '--val-file', str(data / 'dev.csv'), '--steps', '2', '-b', '2', '--threads', '1',
            '--output', str(tmp_path / 'out')]
    assert expected in _fail(text_train.main, argv, capsys)


# the damaged tokenizers (a model larger than its tokenizer is no problem here: the new model's vocabulary is the
# tokenizer's)
@pytest.mark.parametrize('damaged', [k for k in DAMAGE if 'tokenizer' in k and 'larger' not in k or 'vocab.txt' in k],
                         indirect=True)
def test_damaged_tokenizer_given_to_tokenizer_from(damaged, data, tmp_path, capsys, request):
    expected = DAMAGE[request.node.callspec.params['damaged']][2]
    argv = TINY_GPT + ['--train-file', str(data / 'tiny.txt'), '--tokenizer-from', str(damaged),
                       '--output', str(tmp_path)]
    assert expected in _fail(text_train.main, argv, capsys)


@pytest.mark.parametrize('damaged', list(DAMAGE), indirect=True)
def test_from_pretrained_raises_usage_error(damaged, request):
    expected = DAMAGE[request.node.callspec.params['damaged']][2]
    with pytest.raises(UsageError, match=re.escape(expected)):
        mt.from_pretrained(str(damaged))


# ------------------------------------------------------------------------------------------------ data and values
def test_quoted_newline_in_a_csv_field_is_kept(tmp_path):
    path = tmp_path / 'train.csv'
    path.write_text('sentence,label\n"first line\nsecond line",1\n"x\u2028y",0\nplain,1\n')
    data = read_labelled_file(str(path))
    assert data.texts == ['first line\nsecond line', 'x\u2028y', 'plain'] and data.labels == ['1', '0', '1']
    path.write_text('sentence,label\n"two\nlines",1\nragged,1,extra\n')
    with pytest.raises(UsageError, match='line 4 has 3 fields'):  # line numbers count the field's line break
        read_labelled_file(str(path))


def test_a_vocabulary_smaller_than_asked_is_a_warning(data, caplog):
    text = (data / 'tiny.txt').read_text()
    with caplog.at_level(logging.WARNING, logger='mlp_vision.text.training_data'):
        tokenizer = build_tokenizer('wordpiece', 'mlm', text, vocab_size=8000)
    assert tokenizer.vocab_size < 8000
    assert f'--vocab-size 8000: the wordpiece vocabulary trained on the training text has only ' \
           f'{tokenizer.vocab_size} tokens' in caplog.text


@pytest.mark.parametrize('field, value', [('layer_norm_eps', math.nan), ('layer_norm_eps', 0.),
                                          ('num_hidden_layers', 0), ('hidden_dropout_prob', 1.),
                                          ('initializer_range', math.inf), ('tiny_attention_size', -1)])
def test_config_values_are_range_checked(field, value):
    sizes = dict(num_hidden_layers=1, hidden_size=16, intermediate_size=32, max_position_embeddings=16)
    with pytest.raises(ValueError, match=f'GMLPConfig.{field} must be'):
        mt.create_model('amlp_base', **{**sizes, field: value})


def test_generate_checks_its_sampling_values():
    model = mt.create_model('gpt_sdpa', num_hidden_layers=1, hidden_size=16, num_attention_heads=2)
    prompt = torch.zeros(1, 2, dtype=torch.long)
    for kwargs, expected in (({'top_k': -1}, 'top_k must be >= 0'), ({'temperature': math.nan}, 'temperature must be'),
                             ({'max_new_tokens': -1}, 'max_new_tokens must be >= 0')):
        with pytest.raises(ValueError, match=expected):
            model.generate(prompt, **{'max_new_tokens': 2, **kwargs})


def test_check_range_messages():
    for args, kwargs, expected in (
            (('--x', math.nan, 0, 1), {}, '--x must be in [0, 1], got nan'),
            (('--x', 1, 0, 1), {'high_open': True}, '--x must be in [0, 1), got 1'),
            (('--x', 0, 0), {'low_open': True}, '--x must be a positive number, got 0'),
            (('--x', 10 ** 400, None, 5), {}, '--x must be <= 5'),
            (('--x', math.inf), {'why': 'why'}, '--x must be a finite number (why), got inf')):
        with pytest.raises(UsageError) as e:
            check_range(*args, **kwargs)
        assert str(e.value).startswith(expected), str(e.value)
    check_range('--x', 10 ** 400, low=1)  # an int too large for a float is still compared exactly


# ------------------------------------------------------------------------------------------------ a corpus's inputs
def test_tokenizer_from_with_truncation_and_padding_encodes_the_corpus_whole(data, tmp_path, caplog):
    """A tokenizer.json saved with truncation (2 tokens) and fixed padding (1,000 tokens) would turn the corpus into
    2 tokens, or pad tokens: both are turned off for the corpus, in one line, and the ids are the plain tokenizer's."""
    from mlp_vision.text.training_data import encode_text, tokenizer_from_path
    text = (data / 'tiny.txt').read_text()
    plain = tokenizer_from_path(str(data / 'subword'))
    payload = json.loads((data / 'subword' / 'tokenizer.json').read_text())
    payload['truncation'] = {'direction': 'Right', 'max_length': 2, 'strategy': 'LongestFirst', 'stride': 0}
    payload['padding'] = {'strategy': {'Fixed': 1000}, 'direction': 'Right', 'pad_to_multiple_of': None,
                          'pad_id': 0, 'pad_type_id': 0, 'pad_token': '[PAD]'}
    (tmp_path / 'tokenizer.json').write_text(json.dumps(payload))
    tok = tokenizer_from_path(str(tmp_path / 'tokenizer.json'))
    assert tok.backend_tokenizer.truncation and tok.backend_tokenizer.padding
    with caplog.at_level(logging.WARNING):
        ids = encode_text(tok, text, 'training text', stop=lambda: 0)
    expected = torch.tensor(plain.encode(text, add_special_tokens=False))
    assert len(expected) > 1000 and torch.equal(ids, expected)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["the tokenizer's truncation to 2 tokens and padding to 1000 tokens (set in its tokenizer.json) "
                    "turned off: the training text is encoded whole and cut into --block-size blocks"], said


def test_tokenizer_from_a_device_is_one_line(data, tmp_path, capsys):
    """/dev/zero (a device: read forever) is refused before it is opened."""
    argv = TINY_GPT + ['--train-file', str(data / 'tiny.txt'), '--tokenizer-from', '/dev/zero',
                       '--output', str(tmp_path)]
    assert '/dev/zero is not a regular file or a folder (a device, FIFO or socket)' in _fail(text_train.main, argv,
                                                                                            capsys)


def test_a_tokenizer_file_larger_than_any_tokenizer_is_not_read(data, tmp_path, monkeypatch):
    import mlp_vision.text.tokenizer as tokenizer
    from mlp_vision.text.training_data import tokenizer_from_path
    monkeypatch.setattr(tokenizer, 'MAX_TOKENIZER_FILE_BYTES', 1000)
    with pytest.raises(UsageError, match=r'tokenizer.json is [\d,]+ bytes, more than the 1,000 a tokenizer file'):
        tokenizer_from_path(str(data / 'subword'))


@pytest.mark.parametrize('kind', ['char', 'byte', 'wordpiece'])
def test_a_line_too_long_to_tokenize_at_once(kind, monkeypatch):
    """A line with no place to cut within MAX_PIECE_CHARS: char / byte tokenizers cut it anywhere (the ids stay the
    whole text's); a subword one cuts at spaces, and a line with none is one line naming it, before tokenizers
    allocates for it (a 100 MB line aborted the process)."""
    import mlp_vision.text.training_data as text_data
    spaced = ' '.join(WORDS * 10)  # one line of ~800 characters, with spaces
    head = f'to be\nor not\n{spaced}\n'
    text = head + 'x' * 500 + '\nthe end\n'
    tok = build_tokenizer(kind, 'causal', text, vocab_size=40)
    monkeypatch.setattr(text_data, 'ENCODE_CHUNK_CHARS', 50)
    monkeypatch.setattr(text_data, 'MAX_PIECE_CHARS', 200)
    if kind != 'wordpiece':
        ids = text_data.encode_text(tok, text, 'training text', stop=lambda: 0)
        assert torch.equal(ids, torch.tensor(tok.encode(text, add_special_tokens=False)))
        return
    ids = text_data.encode_text(tok, head, 'training text', stop=lambda: 0)  # the spaced line: cut at spaces
    assert torch.equal(ids, torch.tensor(tok.encode(head, add_special_tokens=False)))
    with pytest.raises(UsageError, match=r'^line 4 of the training text has 500 characters and no place this '
                                         r'tokenizer can be cut \(a line break or a space between words\) within 200'):
        text_data.encode_text(tok, text, 'training text', stop=lambda: 0)


def test_a_long_line_trains_the_vocabulary_of_its_words(monkeypatch):
    """The subword trainer gets a line over ENCODE_CHUNK_CHARS in pieces cut before spaces (it held ~65 bytes per
    character of a line: a 100 MB line aborted the process): the same words, so the same BPE vocabulary; a line
    with no space to cut at is one line naming it."""
    import mlp_vision.text.training_data as text_data
    rng = random.Random(3)
    text = 'to be\n' + ' '.join(rng.choice(WORDS) for _ in range(400)) + '\nthe end\n'
    whole = build_tokenizer('bpe', 'causal', text, vocab_size=300)
    monkeypatch.setattr(text_data, 'ENCODE_CHUNK_CHARS', 50)
    assert list(text_data._training_lines(text))[0] == 'to be' and len(list(text_data._training_lines(text))) > 20
    assert build_tokenizer('bpe', 'causal', text, vocab_size=300).get_vocab() == whole.get_vocab()
    monkeypatch.setattr(text_data, 'MAX_PIECE_CHARS', 200)
    with pytest.raises(UsageError, match=r'^line 3 of the training text has 300 characters and no place'):
        build_tokenizer('wordpiece', 'causal', 'to be\nor not\n' + 'x' * 300 + '\n', vocab_size=40)
