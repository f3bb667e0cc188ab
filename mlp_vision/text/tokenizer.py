""" Tokenizers of the text models: ``transformers.PreTrainedTokenizerFast`` objects over a ``tokenizers.Tokenizer``
(padding, truncation, batching, special tokens and saving are the libraries')::

    tok = load_tokenizer('ckpt/')                      # what save_pretrained wrote, a vocab.txt or a tokenizer.json
    tok.save_pretrained('ckpt/')                       # tokenizer.json + tokenizer_config.json, for AutoTokenizer too

* :func:`byte_tokenizer` (any text, a fixed vocabulary) and :func:`char_tokenizer` (the alphabet of a corpus:
  nanoGPT's Tiny Shakespeare vocabulary of 65), their special tokens after the bytes / characters.
* WordPiece / BPE -- a BERT ``vocab.txt`` (:func:`wordpiece_tokenizer`), any ``tokenizer.json``, or a vocabulary
  trained with :func:`train_tokenizer`. BiGS used BERT's uncased WordPiece, 30,522 tokens (arXiv 2212.10544, §5).

Sequences follow BERT's template (arXiv 1810.04805, §3): ``<cls> A <sep>`` and ``<cls> A <sep> B <sep>``, token type
1 after the first ``<sep>``; padding is on the right, the only layout the models accept. The byte and char
tokenizers read special-token strings in the text as text (``split_special_tokens``); WordPiece / BPE, and the saved
files (``AutoTokenizer``, ``pipeline``), recognise them. A ``tokenizer.json`` with a regular expression is refused
unless ``allow_regex=True`` (:func:`check_no_regex`).
"""
import json
import os
import re
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from tokenizers import Tokenizer as Backend, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from mlp_vision.arguments import check_range
from mlp_vision.errors import UsageError, short_repr

__all__ = [
    'Tokenizer', 'byte_tokenizer', 'char_tokenizer', 'wordpiece_tokenizer', 'train_tokenizer', 'load_tokenizer',
    'find_tokenizer', 'tokenizer_kind', 'unknown_character', 'check_vocab_size', 'DEFAULT_CONTROL_TOKENS',
    'BERT_CONTROL_TOKENS', 'SUBWORD_KINDS', 'check_no_regex']

Tokenizer = PreTrainedTokenizerFast  # every tokenizer of the package is one
DEFAULT_CONTROL_TOKENS = ('<pad>', '<cls>', '<sep>', '<mask>')
# BERT's names, in the order a trained vocabulary gets them (so <pad> is id 0, BiGS' default pad_token_id)
BERT_CONTROL_TOKENS = {'pad': '[PAD]', 'unk': '[UNK]', 'cls': '[CLS]', 'sep': '[SEP]', 'mask': '[MASK]'}
SUBWORD_KINDS = ('wordpiece', 'bpe')
# the control roles, with their conventional names tried in order when a file does not say which token plays one
_ROLE_NAMES = {
    'pad': ('[PAD]', '<pad>'), 'unk': ('[UNK]', '<unk>'), 'cls': ('[CLS]', '<cls>', '<s>'),
    'sep': ('[SEP]', '<sep>', '</s>'), 'mask': ('[MASK]', '<mask>'),
}


# ------------------------------------------------------------------------------------------------ the wrapper

def _wrap(backend: Backend, kind: str, special_tokens_map: Mapping[str, str],
          do_lower_case: Optional[bool] = None) -> PreTrainedTokenizerFast:
    """``backend`` with BERT's template as post-processor behind ``PreTrainedTokenizerFast``. ``special_tokens_map``:
    role (``pad unk cls sep mask``) -> token (roles the vocabulary lacks are left out). ``kind`` (byte / char /
    subword) is kept in ``init_kwargs['tokenizer_type']`` and in the saved ``tokenizer_config.json``; byte and char
    tokenizers read special-token strings in the text as text."""
    roles = {r: t for r, t in special_tokens_map.items()
             if r in _ROLE_NAMES and t is not None and backend.token_to_id(t) is not None}
    backend.add_special_tokens(list(roles.values()))  # matched whole in text, skipped by decode(skip_special_tokens)
    cls_token, sep_token = roles.get('cls'), roles.get('sep')
    if cls_token or sep_token:
        first = ' '.join(t for t in (cls_token, '$A', sep_token) if t)
        pair = f'{first} $B:1 {sep_token}:1' if sep_token else None  # no separator: pairs cannot be told apart
        backend.post_processor = processors.TemplateProcessing(
            single=first, pair=pair,
            special_tokens=[(t, backend.token_to_id(t)) for t in (cls_token, sep_token) if t])
    else:
        backend.post_processor = None
    extra = {} if do_lower_case is None else {'do_lower_case': do_lower_case}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, **{f'{r}_token': t for r, t in roles.items()}, tokenizer_type=kind,
        padding_side='right', clean_up_tokenization_spaces=False,
        model_input_names=['input_ids', 'token_type_ids', 'attention_mask'], **extra)
    tok.split_special_tokens = kind in ('byte', 'char')  # not saved: AutoTokenizer's form recognises them
    return tok


def tokenizer_kind(tok: PreTrainedTokenizerFast) -> str:
    """'byte', 'char' or 'subword' ('subword' for a ``tokenizer.json`` this package did not write)."""
    return tok.init_kwargs.get('tokenizer_type') or 'subword'


def _roles_of(special_tokens: Iterable[str]) -> Dict[str, str]:
    """role -> token for the tokens with a conventional role name (``<pad>``, ``[MASK]``...)."""
    tokens = set(special_tokens)
    return {role: next(n for n in names if n in tokens) for role, names in _ROLE_NAMES.items()
            if any(n in tokens for n in names)}


def _appended_specials(base: Dict[str, int], special_tokens: Iterable[str]) -> Tuple[Dict[str, int], List[str]]:
    specials = list(special_tokens)
    if len(set(specials)) != len(specials):
        raise ValueError(f'duplicate special tokens: {specials}')
    return {**base, **{t: len(base) + i for i, t in enumerate(specials)}}, specials


def byte_tokenizer(special_tokens: Iterable[str] = DEFAULT_CONTROL_TOKENS) -> PreTrainedTokenizerFast:
    """UTF-8 bytes, ``len(tok) = 256 + len(special_tokens)``: a byte-level BPE without merges (``tokenizers``'
    ByteLevel step maps each byte to one printable character, GPT-2's ``bytes_to_unicode`` table, and the
    vocabulary gives that character the byte's value). Invalid UTF-8 decodes to U+FFFD."""
    vocab, specials = _appended_specials({c: b for b, c in bytes_to_unicode().items()}, special_tokens)
    backend = Backend(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    return _wrap(backend, 'byte', _roles_of(specials))


def char_tokenizer(chars: Iterable[str], special_tokens: Iterable[str] = (),
                   unk: Optional[str] = None) -> PreTrainedTokenizerFast:
    """One id per character of the alphabet ``chars`` (duplicates removed, sorted), ``special_tokens`` after them.
    ``unk``: a special token (added when missing) that characters outside the alphabet map to; without it they
    are an error. An empty-string ``Split`` (no regular expression) isolates each character."""
    alphabet = sorted(set(chars))
    if any(len(c) != 1 for c in alphabet):
        raise ValueError('chars must be single characters')
    specials = list(special_tokens) + ([unk] if unk is not None and unk not in special_tokens else [])
    vocab, specials = _appended_specials({c: i for i, c in enumerate(alphabet)}, specials)
    backend = Backend(models.WordLevel(vocab=vocab, unk_token=unk))
    backend.pre_tokenizer = pre_tokenizers.Split('', behavior='isolated')
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)
    return _wrap(backend, 'char', {**_roles_of(specials), **({'unk': unk} if unk is not None else {})})


def _bert_wordpiece(vocab, unk_token: str, lowercase: bool) -> Backend:
    """BERT's WordPiece (normalizer, pre-tokenizer, ``##`` continuation) over ``vocab`` (None: to be trained)."""
    backend = Backend(models.WordPiece(vocab, unk_token=unk_token) if vocab else models.WordPiece(unk_token=unk_token))
    backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    return backend


def wordpiece_tokenizer(path: str, do_lower_case: Optional[bool] = None,
                        special_tokens_map: Optional[Mapping[str, str]] = None) -> PreTrainedTokenizerFast:
    """A BERT WordPiece tokenizer from a ``vocab.txt`` (one token per line, the line number is its id).
    ``do_lower_case`` None: uncased (lower-casing and stripping accents, as BERT's uncased tokenizer) when no
    ordinary token of the vocabulary has an upper-case letter (the cased ones hold 'The', 'Paris', ...)."""
    vocab = models.WordPiece.read_file(path)
    if not vocab:
        raise ValueError(f'{path} holds no tokens')
    if do_lower_case is None:  # uncased: no ordinary token (not [...] / <...>) has an upper-case letter
        do_lower_case = not any(t != t.lower() for t in vocab if not re.match(r'^(\[.*\]|<.*>)$', t))
    specials = {**_roles_of(vocab), **(special_tokens_map or {})}
    if 'unk' not in specials:
        raise ValueError(f'{path}: no unknown-word token ([UNK] or <unk>) in the vocabulary; WordPiece needs one')
    return _wrap(_bert_wordpiece(vocab, specials['unk'], do_lower_case), 'subword', specials, do_lower_case)


def unknown_character(tok: PreTrainedTokenizerFast, texts: Sequence[str], error: Exception) -> str:
    """The first character of ``texts`` outside a char tokenizer's alphabet, for the message of the ``error``
    ``tokenizers`` raised ("Missing [UNK] token"); the error itself when there is none."""
    if tokenizer_kind(tok) == 'char':
        vocab = tok.get_vocab()
        found = next((c for text in texts for c in text if c not in vocab), None)
        if found is not None:
            return found
    raise error


MAX_VOCAB_SIZE = 2 ** 20  # the largest vocabularies in use are ~256k; tokenizers' trainer aborts the process
# (a Rust allocation failure, not an exception) when it reserves room for a vocabulary of 1e9 (~70 GB)


def check_vocab_size(name: str, kind: str, vocab_size: int) -> None:
    """A ``ValueError`` (:class:`~mlp_vision.errors.UsageError`) naming ``name`` unless a ``kind`` vocabulary
    of ``vocab_size`` tokens has room for a text token beside the special ones (byte-level BPE: beside all 256
    bytes, which it always keeps) and is at most :data:`MAX_VOCAB_SIZE`."""
    base = 256 if kind == 'bpe' else 0
    specials = len(BERT_CONTROL_TOKENS)
    why = (f'byte-level BPE keeps the 256 bytes and {specials} special tokens' if base else
           f'room for text tokens beside the {specials} special tokens')
    check_range(name, vocab_size, low=base + specials + 1, why=why)
    check_range(name, vocab_size, high=MAX_VOCAB_SIZE, why='the largest vocabularies in use have ~256k tokens')


def train_tokenizer(texts: Optional[Iterable[str]] = None, files: Optional[Sequence[str]] = None,
                    kind: str = 'wordpiece', vocab_size: int = 8000, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """A lower-cased subword vocabulary trained on ``texts`` (strings, e.g. lines) or ``files``: ``kind``
    'wordpiece' (BERT's uncased normalizer, pre-tokenizer and ``##`` prefix) or 'bpe' (GPT-2's byte-level BPE: the
    256 bytes always in, no unknown words); at most ``vocab_size`` tokens, specials included; a merge occurs
    ``min_frequency`` times; :data:`BERT_CONTROL_TOKENS` get the first ids, in order.

    BPE depends only on the corpus and the arguments; ``tokenizers``' WordPiece trainer breaks ties in hash order,
    so two runs can keep different rare pieces: train once and save it (one DDP rank, the others load it).
    """
    if kind not in SUBWORD_KINDS:
        raise ValueError(f'kind must be one of {SUBWORD_KINDS}, got {kind!r}')
    if (texts is None) == (files is None):
        raise ValueError('give exactly one of texts= (strings) or files= (paths)')
    specials = list(BERT_CONTROL_TOKENS.values())
    check_vocab_size('vocab_size', kind, vocab_size)
    if kind == 'wordpiece':
        backend = _bert_wordpiece(None, BERT_CONTROL_TOKENS['unk'], lowercase=True)
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=specials, show_progress=False)
    else:
        backend = Backend(models.BPE())
        backend.normalizer = normalizers.Lowercase()
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    if files is not None:
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f'corpus files not found: {missing}')
        backend.train(list(files), trainer)
    else:
        backend.train_from_iterator(texts, trainer)
    return _wrap(backend, 'subword', BERT_CONTROL_TOKENS, do_lower_case=True)


# ---------------------------------------------------------------------------------------------------- loading

def _regexes(node: Any, where: str = '') -> Iterator[Tuple[str, Any]]:
    """(where, pattern) of each ``{"Regex": pattern}`` in a parsed ``tokenizer.json``."""
    if isinstance(node, dict):
        if 'Regex' in node:
            yield where, node['Regex']
        for key, value in node.items():
            yield from _regexes(value, f'{where}.{key}' if where else key)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _regexes(value, f'{where}[{i}]')


def check_no_regex(payload: Mapping[str, Any], where: str, allow_regex: bool = False) -> None:
    """A :class:`UsageError` naming ``where`` and the field when the parsed ``tokenizer.json`` ``payload`` holds a
    regular expression (``{"Regex": ...}``: a ``Split`` or ``Replace`` normalizer / pre-tokenizer), unless
    ``allow_regex``. ``tokenizers`` matches them with a backtracking engine: a crafted pattern such as ``(a+)+$``
    takes minutes per text."""
    steps = {k: v for k, v in payload.items() if k not in ('model', 'added_tokens')}  # the vocabulary: no patterns
    for field, pattern in ([] if allow_regex else _regexes(steps)):
        raise UsageError(f'{where}: {field} is the regular expression {short_repr(pattern, 80)}, refused: a crafted '
                         f'pattern takes minutes per text; the tokenizers this package writes use none. Load a file '
                         f'you trust with --allow-regex (allow_regex=True in Python)')


# the largest tokenizer file read: tokenizer.json files in use are up to a few tens of MB (262k tokens: ~33 MB)
MAX_TOKENIZER_FILE_BYTES = 256 * 2 ** 20


def _read_tokenizer_file(path: str, read: Callable[[str], Any]) -> Any:
    """``read(path)``; a file over :data:`MAX_TOKENIZER_FILE_BYTES`, damaged or of another kind is a
    :class:`UsageError` naming it (instead of a traceback from json, a missing key, or ``tokenizers``' Rust parser --
    including its panics, ``pyo3_runtime.PanicException``, a ``BaseException``)."""
    size = os.path.getsize(path)
    if size > MAX_TOKENIZER_FILE_BYTES:
        raise UsageError(f'{path} is {size:,} bytes, more than the {MAX_TOKENIZER_FILE_BYTES:,} a tokenizer file of '
                         f'{MAX_VOCAB_SIZE:,} tokens needs; it is not one, and is not read')
    try:
        return read(path)
    except (OSError, UsageError):
        raise  # a file that cannot be read, or a refused one: each names its file
    except BaseException as e:  # json's ValueError, KeyError / TypeError of a missing field, tokenizers' errors
        if not isinstance(e, Exception) and type(e).__name__ != 'PanicException':
            raise  # KeyboardInterrupt, SystemExit: not the file's fault
        detail = str(e).splitlines()[0] if str(e) else ''
        raise UsageError(f'{path} is not a tokenizer file this package reads ({type(e).__name__}: {detail}); it is '
                         f'damaged, truncated or of another kind') from None


def _read_config(path: str) -> Dict[str, Any]:
    with open(path, encoding='utf-8') as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f'expected a JSON object, got a {type(config).__name__}')
    return config


def _from_tokenizer_json(path: str, config: Mapping[str, Any], allow_regex: bool) -> PreTrainedTokenizerFast:
    """Any ``tokenizer.json`` of ``tokenizers``; ``config`` (its ``tokenizer_config.json``) gives the kind, casing and
    special tokens, roles it does not name are found by their usual names ([PAD]/<pad>, [CLS]/<cls>/<s>, ...)."""
    with open(path, encoding='utf-8') as f:
        text = f.read()
    check_no_regex(json.loads(text), path, allow_regex)
    backend = Backend.from_str(text)
    kind = config.get('tokenizer_type') if config.get('tokenizer_type') in ('byte', 'char') else 'subword'
    return _wrap(backend, kind, {**_roles_of(backend.get_vocab(with_added_tokens=True)), **_config_roles(config)},
                 config.get('do_lower_case'))


def _config_roles(config: Mapping[str, Any]) -> Dict[str, str]:
    """role -> token named by a ``tokenizer_config.json`` (``cls_token``: a string or transformers' AddedToken)."""
    values = {role: config.get(f'{role}_token') for role in _ROLE_NAMES}
    values = {role: v.get('content') if isinstance(v, dict) else v for role, v in values.items()}
    return {role: v for role, v in values.items() if isinstance(v, str)}


def _is_tokenizer_json(path: str) -> bool:
    """Whether the file ``path`` is a JSON object with a ``model`` (a ``tokenizer.json``)."""
    try:
        return 'model' in _read_tokenizer_file(path, _read_config)
    except UsageError:
        return False


def find_tokenizer(path: str, allow_regex: bool = False) -> Optional[PreTrainedTokenizerFast]:
    """The tokenizer of a folder or file, or None (a folder without one): a ``tokenizer.json`` (kind, casing and
    special tokens from the folder's ``tokenizer_config.json``), else a ``vocab.txt`` (BERT WordPiece, casing from
    ``do_lower_case`` there, else :func:`wordpiece_tokenizer`'s guess). A regular expression is refused unless
    ``allow_regex`` (:func:`check_no_regex`)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f'{path} does not exist')
    if os.path.isdir(path):
        config_file = os.path.join(path, 'tokenizer_config.json')
        config = _read_tokenizer_file(config_file, _read_config) if os.path.isfile(config_file) else {}
        tokenizer_file, vocab_file = os.path.join(path, 'tokenizer.json'), os.path.join(path, 'vocab.txt')
    elif os.path.isfile(path):
        if path.endswith('.txt'):
            config, tokenizer_file, vocab_file = {}, None, path
        elif _is_tokenizer_json(path):
            config, tokenizer_file, vocab_file = {}, path, None
        else:
            return None  # a file of another kind: a config.json, an optimizer.pt
    else:  # /dev/zero would be read forever
        raise UsageError(f'{path} is not a regular file or a folder (a device, FIFO or socket); expected a tokenizer '
                         f'folder, a tokenizer.json or a vocab.txt')
    if tokenizer_file and os.path.isfile(tokenizer_file):
        return _read_tokenizer_file(tokenizer_file, lambda f: _from_tokenizer_json(f, config, allow_regex))
    if vocab_file and os.path.isfile(vocab_file):
        return _read_tokenizer_file(vocab_file, lambda f: wordpiece_tokenizer(f, config.get('do_lower_case'),
                                                                              _config_roles(config)))
    return None


def load_tokenizer(path: str, allow_regex: bool = False) -> PreTrainedTokenizerFast:
    """As :func:`find_tokenizer`, but a folder without a tokenizer is an error."""
    tok = find_tokenizer(path, allow_regex)
    if tok is None:
        raise FileNotFoundError(f'{path} holds no tokenizer (expected tokenizer.json or vocab.txt)')
    return tok
