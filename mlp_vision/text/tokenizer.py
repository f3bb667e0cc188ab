""" Tokenizers of the text models: UTF-8 bytes, the characters of a corpus, or subwords (WordPiece / BPE).

All three share the :class:`Tokenizer` interface::

    tok = load_tokenizer('ckpt/')                      # whatever save_pretrained wrote, a vocab.txt or a tokenizer.json
    tok.encode('the movie was good')                   # ids, no special tokens
    batch = tok(['a sentence', 'another'], ['its pair', 'pair'], max_length=64, truncation=True,
                padding='max_length', return_tensors='pt')   # input_ids, attention_mask, token_type_ids (B, 64)
    model(**batch)                                     # BiGS / BERT; gMLP and GPT take return_token_type_ids=False
    tok.decode(ids); tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.unk_id; tok.vocab_size
    tok.save_pretrained('ckpt/')

* :class:`ByteTokenizer` -- ids 0..255 are the UTF-8 bytes, special tokens follow (256, 257, ...). Covers any text
  with a fixed vocabulary; the default specials ``<pad> <cls> <sep> <mask>`` serve masked LM and the BERT protocol.
* :class:`CharTokenizer` -- one id per distinct character of a corpus, in sorted order (ids 0..C-1), special tokens
  after them. Without specials it reproduces nanoGPT's / the MLP-Attention paper's Tiny Shakespeare vocabulary (65
  characters).
* :class:`SubwordTokenizer` -- Hugging Face's ``tokenizers`` (the Rust implementation; nothing is downloaded): a
  BERT ``vocab.txt`` (WordPiece, lower-cased when the vocabulary is uncased), any ``tokenizer.json``, or a WordPiece
  / byte-level BPE vocabulary trained offline on a corpus with :func:`train_tokenizer`. BiGS was pretrained with
  BERT's uncased WordPiece vocabulary of 30,522 tokens (arXiv 2212.10544, §5 "Pretraining").

Sequences follow BERT's template (arXiv 1810.04805, §3 "Input/Output Representations"): ``<cls> A <sep>`` and
``<cls> A <sep> B <sep>``, token type 0 up to and including the first ``<sep>``, 1 after it; a tokenizer without a
``<cls>`` (the char tokenizer of a causal LM) adds nothing. Padding is on the right, the only layout the models
accept.

A ``tokenizer.json`` with a regular expression in its normalizer, pre-tokenizer or elsewhere (``Split`` /
``Replace`` with ``{"Regex": ...}``) is refused unless the caller opts in (``allow_regex=True``): ``tokenizers``
runs them with a backtracking engine, and a crafted pattern takes minutes per text. The tokenizers this package
writes use none (BERT's normalizer and pre-tokenizer, byte-level BPE's built-in split).

Special-token strings in the text: the byte and char tokenizers never produce special ids from text; a subword
tokenizer recognises its special tokens (as ``transformers`` does). Insert them by id to be independent of that.

Every tokenizer here also has a ``transformers`` form with the same ids (:meth:`Tokenizer.to_transformers`; the
``tokenizer.json`` that :meth:`Tokenizer.save_pretrained` writes beside ``tokenizer_config.json``), so a saved
folder works in ``transformers.pipeline`` whichever tokenizer it holds; that form recognises special-token strings
in the text, as every ``transformers`` tokenizer does.
"""
import json
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from mlp_vision.errors import UsageError, check_range, short_repr

__all__ = [
    'Tokenizer', 'ByteTokenizer', 'CharTokenizer', 'SubwordTokenizer', 'train_tokenizer', 'load_tokenizer',
    'find_tokenizer', 'tokenizer_from_dict', 'check_vocab_size', 'DEFAULT_CONTROL_TOKENS', 'BERT_CONTROL_TOKENS',
    'SUBWORD_KINDS', 'check_no_regex',
]

DEFAULT_CONTROL_TOKENS = ('<pad>', '<cls>', '<sep>', '<mask>')
# BERT's names, in the order a trained vocabulary gets them (so <pad> is id 0, BiGS' default pad_token_id)
BERT_CONTROL_TOKENS = {'pad': '[PAD]', 'unk': '[UNK]', 'cls': '[CLS]', 'sep': '[SEP]', 'mask': '[MASK]'}
CONTROL_ROLES = ('pad', 'unk', 'cls', 'sep', 'mask')
SUBWORD_KINDS = ('wordpiece', 'bpe')
TOKENIZER_CONFIG_NAME = 'tokenizer_config.json'
TOKENIZER_FILE_NAME = 'tokenizer.json'
VOCAB_FILE_NAME = 'vocab.txt'
# conventional names of each role, tried in order when a file does not say which token plays it
_ROLE_NAMES = {
    'pad': ('[PAD]', '<pad>'), 'unk': ('[UNK]', '<unk>'), 'cls': ('[CLS]', '<cls>', '<s>'),
    'sep': ('[SEP]', '<sep>', '</s>'), 'mask': ('[MASK]', '<mask>'),
}


class Tokenizer:
    """The interface of every tokenizer here.

    Subclasses implement ``vocab_size``, ``encode`` (text -> ids without special tokens), ``decode``,
    ``token_to_id`` (None for an unknown token), ``id_to_token``, ``to_dict`` and set ``special_tokens_map``
    (role -> token string for the roles ``pad unk cls sep mask`` they have).
    """
    special_tokens_map: Dict[str, str]

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> List[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> Optional[int]:
        raise NotImplementedError

    def id_to_token(self, index: int) -> str:
        raise NotImplementedError

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON-able values that :func:`tokenizer_from_dict` turns back into this tokenizer (for
        checkpoints loaded with ``torch.load(weights_only=True)``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ special tokens
    def _special_id(self, role: str) -> Optional[int]:
        token = self.special_tokens_map.get(role)
        return None if token is None else self.token_to_id(token)

    @property
    def pad_id(self) -> Optional[int]:
        return self._special_id('pad')

    @property
    def unk_id(self) -> Optional[int]:
        return self._special_id('unk')

    @property
    def cls_id(self) -> Optional[int]:
        return self._special_id('cls')

    @property
    def sep_id(self) -> Optional[int]:
        return self._special_id('sep')

    @property
    def mask_id(self) -> Optional[int]:
        return self._special_id('mask')

    @property
    def mask_token(self) -> Optional[str]:
        return self.special_tokens_map.get('mask')

    @property
    def special_ids(self) -> List[int]:
        """Sorted ids of the special tokens (the ones masked-LM corruption never picks)."""
        return sorted({i for i in (self._special_id(r) for r in self.special_tokens_map) if i is not None})

    # ------------------------------------------------------------------ sequences
    def build_inputs(self, ids: List[int], pair_ids: Optional[List[int]] = None):
        """(input ids, token type ids) of one sequence or pair with the special tokens of the BERT template."""
        cls_id, sep_id = self.cls_id, self.sep_id
        if pair_ids is not None and sep_id is None:
            raise ValueError(f'{type(self).__name__} has no separator token; it cannot encode sentence pairs')
        first = ([cls_id] if cls_id is not None else []) + ids + ([sep_id] if sep_id is not None else [])
        if pair_ids is None:
            return first, [0] * len(first)
        second = pair_ids + [sep_id]
        return first + second, [0] * len(first) + [1] * len(second)

    def num_special_tokens(self, pair: bool = False) -> int:
        return len(self.build_inputs([], [] if pair else None)[0])

    def __call__(
            self,
            text: Union[str, Sequence[str]],
            text_pair: Union[None, str, Sequence[str]] = None,
            *,
            add_special_tokens: bool = True,
            max_length: Optional[int] = None,
            truncation: bool = False,
            padding: Union[bool, str] = False,
            return_tensors: Optional[str] = None,
            return_token_type_ids: bool = True,
    ) -> Dict[str, Any]:
        """Encode a text (or a batch) with the template, optional truncation and right padding.

        Args:
            text: a string or a list of strings.
            text_pair: the second segments (same structure as ``text``), or None.
            max_length: the longest allowed result (with the special tokens).
            truncation: cut sequences to ``max_length``, longest segment first; without it a longer sequence stops
                with an error.
            padding: False (none), True / 'longest' (to the longest in the batch) or 'max_length'.
            return_tensors: None (lists) or 'pt' (int64 tensors of shape (B, L); a single text gives B = 1).

        Returns: a dict with ``input_ids``, ``attention_mask`` (1 = real token) and, unless
        ``return_token_type_ids=False``, ``token_type_ids``.
        """
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if text_pair is not None:
            pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
            if isinstance(text_pair, str) != single or len(pairs) != len(texts):
                raise ValueError(f'text_pair must match text: {len(texts)} texts, {len(pairs)} pairs')
        else:
            pairs = [None] * len(texts)
        if padding not in (False, True, 'longest', 'max_length', 'do_not_pad'):
            raise ValueError(f"padding must be False, True, 'longest' or 'max_length', got {padding!r}")
        if (truncation or padding == 'max_length') and max_length is None:
            raise ValueError('truncation and padding="max_length" need max_length')

        rows, types = [], []
        for a, b in zip(texts, pairs):
            ids, pair_ids = self.encode(a), None if b is None else self.encode(b)
            if max_length is not None and truncation:
                budget = max_length - (self.num_special_tokens(b is not None) if add_special_tokens else 0)
                if budget < (0 if b is None else 1):
                    raise ValueError(f'max_length {max_length} leaves no room for text after the special tokens')
                ids, pair_ids = _truncate_longest_first(ids, pair_ids, budget)
            if add_special_tokens:
                ids, type_ids = self.build_inputs(ids, pair_ids)
            else:
                ids = ids + (pair_ids or [])
                type_ids = [0] * (len(ids) - len(pair_ids or [])) + [1] * len(pair_ids or [])
            if max_length is not None and len(ids) > max_length:
                raise ValueError(f'a sequence has {len(ids)} tokens, more than max_length {max_length}; pass '
                                 f'truncation=True to cut it')
            rows.append(ids)
            types.append(type_ids)

        target = None
        if padding == 'max_length':
            target = max_length
        elif padding in (True, 'longest'):
            target = max(len(r) for r in rows)
        masks = [[1] * len(r) for r in rows]
        if target is not None:
            if self.pad_id is None:
                raise ValueError(f'{type(self).__name__} has no padding token; it cannot pad')
            for r, t, m in zip(rows, types, masks):
                n = target - len(r)
                r.extend([self.pad_id] * n)
                t.extend([0] * n)
                m.extend([0] * n)
        out = {'input_ids': rows, 'attention_mask': masks}
        if return_token_type_ids:
            out['token_type_ids'] = types
        if return_tensors == 'pt':
            import torch
            if len({len(r) for r in rows}) > 1:
                raise ValueError('sequences of different lengths cannot be stacked into a tensor; pass padding=True')
            return {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}
        if return_tensors is not None:
            raise ValueError(f"return_tensors must be None or 'pt', got {return_tensors!r}")
        return {k: v[0] for k, v in out.items()} if single else out

    # ------------------------------------------------------------------ files
    def _hf_backend(self):
        """A new ``tokenizers.Tokenizer`` that gives the same ids as :meth:`encode` (without a template)."""
        raise NotImplementedError

    def _backend_with_template(self):
        """:meth:`_hf_backend` whose post-processor applies BERT's template (``<cls> A <sep> [B <sep>]``, token
        types 0 / 1) the way :meth:`build_inputs` does, for ``transformers``, which reads the template there."""
        from tokenizers import processors
        backend = self._hf_backend()
        cls_token, sep_token = self.special_tokens_map.get('cls'), self.special_tokens_map.get('sep')
        if cls_token and sep_token:
            backend.post_processor = processors.TemplateProcessing(
                single=f'{cls_token} $A {sep_token}', pair=f'{cls_token} $A {sep_token} $B:1 {sep_token}:1',
                special_tokens=[(cls_token, self.cls_id), (sep_token, self.sep_id)])
        return backend

    def _transformers_config(self) -> Dict[str, Any]:
        """What ``transformers`` needs besides ``tokenizer.json``: the special tokens by role and the model inputs."""
        config = {f'{role}_token': token for role, token in self.special_tokens_map.items()}
        config['model_input_names'] = ['input_ids', 'token_type_ids', 'attention_mask']
        return config

    def _saved_fields(self) -> Dict[str, Any]:
        """What :func:`find_tokenizer` reads back from ``tokenizer_config.json`` besides ``tokenizer.json``."""
        return self.to_dict()

    def save_pretrained(self, directory: str) -> None:
        """``tokenizer.json`` (with BERT's template as post-processor, so that ``transformers.AutoTokenizer`` and
        ``pipeline(task, model=directory)`` give the same ids) and ``tokenizer_config.json`` (the special tokens by
        role, as ``transformers`` names them, and what :func:`load_tokenizer` reads)."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, TOKENIZER_FILE_NAME)
        self._backend_with_template().save(path + '.tmp')
        os.replace(path + '.tmp', path)
        config = {**self._saved_fields(), **self._transformers_config(), 'tokenizer_class': 'PreTrainedTokenizerFast'}
        _write_json(os.path.join(directory, TOKENIZER_CONFIG_NAME), config)

    def to_transformers(self):
        """This tokenizer as a ``transformers.PreTrainedTokenizerFast`` (same ids, template, token types and special
        tokens), for ``transformers.pipeline``; needs ``transformers``. ``AutoTokenizer.from_pretrained`` on a folder
        written by :meth:`save_pretrained` gives the same tokenizer. Unlike :meth:`encode` of the byte and char
        tokenizers, it recognises special-token strings in the text, as every ``transformers`` tokenizer does
        (that is how the fill-mask pipeline finds ``<mask>``)."""
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast(tokenizer_object=self._backend_with_template(), **self._transformers_config())

    @staticmethod
    def from_pretrained(path: str) -> 'Tokenizer':
        """Same as :func:`load_tokenizer`."""
        return load_tokenizer(path)

    def __repr__(self) -> str:
        return f'{type(self).__name__}(vocab_size={self.vocab_size}, special_tokens={self.special_tokens_map})'


def _truncate_longest_first(ids: List[int], pair_ids: Optional[List[int]], budget: int):
    """Drop tokens from the end of the longer segment (the second on ties) until both fit in ``budget``."""
    if pair_ids is None:
        return ids[:budget], None
    n_a, n_b = len(ids), len(pair_ids)
    while n_a + n_b > budget:
        if n_a > n_b:
            n_a -= 1
        else:
            n_b -= 1
    return ids[:n_a], pair_ids[:n_b]


def _write_json(path: str, obj: Any) -> None:
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
    os.replace(path + '.tmp', path)


# ------------------------------------------------------------------------------------------ byte / char tokenizers

class _AppendedSpecials(Tokenizer):
    """Specials appended after a fixed base vocabulary of ``_base_size`` ids; roles by their conventional names."""
    _base_size: int

    def _init_specials(self, special_tokens: Iterable[str]) -> None:
        self.special_tokens = tuple(special_tokens)
        if len(set(self.special_tokens)) != len(self.special_tokens):
            raise ValueError(f'duplicate special tokens: {self.special_tokens}')
        self._special_to_id = {t: self._base_size + i for i, t in enumerate(self.special_tokens)}
        self.special_tokens_map = {role: name for role, names in _ROLE_NAMES.items() for name in names
                                   if name in self._special_to_id}

    @property
    def vocab_size(self) -> int:
        return self._base_size + len(self.special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        """Id of a special token (e.g. ``'<mask>'``), or None."""
        return self._special_to_id.get(token)

    @property
    def special_ids(self) -> List[int]:
        """Ids of every appended special token, whatever its role."""
        return list(self._special_to_id.values())

    def id_to_token(self, index: int) -> str:
        if self._base_size <= index < self.vocab_size:
            return self.special_tokens[index - self._base_size]
        return self.decode([index])


class ByteTokenizer(_AppendedSpecials):
    """UTF-8 byte tokenizer: ``vocab_size = 256 + len(special_tokens)``.

    ``decode`` drops special ids and replaces invalid UTF-8 (e.g. a sequence cut inside a character) with U+FFFD.
    """

    def __init__(self, special_tokens: Iterable[str] = DEFAULT_CONTROL_TOKENS):
        self._base_size = 256
        self._init_specials(special_tokens)

    def encode(self, text: str) -> List[int]:
        return list(text.encode('utf-8'))

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode('utf-8', errors='replace')

    def to_dict(self) -> Dict[str, Any]:
        return {'tokenizer_type': 'byte', 'special_tokens': list(self.special_tokens)}

    def _hf_backend(self):
        """Byte-level BPE without merges: ``tokenizers``' ByteLevel step maps each byte to one printable character
        (GPT-2's table, :func:`_byte_characters`), and the vocabulary gives that character the byte's value."""
        from tokenizers import Tokenizer as Backend, decoders, models, pre_tokenizers
        vocab = {char: byte for byte, char in enumerate(_byte_characters())}
        backend = Backend(models.BPE(vocab={**vocab, **self._special_to_id}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens(list(self.special_tokens))
        return backend


class CharTokenizer(_AppendedSpecials):
    """Character tokenizer over a fixed alphabet (sorted), specials after it.

    Args:
        chars: the alphabet (duplicates removed, sorted).
        special_tokens: appended after the characters.
        unk: if given, a special token (added when missing) that unknown characters map to; otherwise ``encode``
            raises ``KeyError`` on a character outside the alphabet.
    """

    def __init__(self, chars: Iterable[str], special_tokens: Iterable[str] = (), unk: Optional[str] = None):
        self.chars = sorted(set(chars))
        if any(len(c) != 1 for c in self.chars):
            raise ValueError('chars must be single characters')
        specials = list(special_tokens)
        if unk is not None and unk not in specials:
            specials.append(unk)
        self.unk = unk
        self._base_size = len(self.chars)
        self._init_specials(specials)
        if unk is not None:
            self.special_tokens_map['unk'] = unk
        self._stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str, special_tokens: Iterable[str] = (), unk: Optional[str] = None) -> 'CharTokenizer':
        """Alphabet = the distinct characters of ``text``."""
        return cls(set(text), special_tokens, unk)

    def encode(self, text: str) -> List[int]:
        if self.unk is None:
            return [self._stoi[c] for c in text]
        unk_id = self._special_to_id[self.unk]
        return [self._stoi.get(c, unk_id) for c in text]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        n = self._base_size
        return ''.join(self.chars[i] for i in ids if 0 <= i < n)

    def to_dict(self) -> Dict[str, Any]:
        return {'tokenizer_type': 'char', 'chars': ''.join(self.chars), 'special_tokens': list(self.special_tokens),
                'unk': self.unk}

    def _hf_backend(self):
        """One token per character: an empty-string ``Split`` (no regular expression) isolates each character and
        a word-level vocabulary maps it; a character outside the alphabet is the unknown token, or, without one, an
        error (as :meth:`encode`'s ``KeyError``), never silently dropped."""
        from tokenizers import Tokenizer as Backend, decoders, models, pre_tokenizers
        vocab = {**self._stoi, **self._special_to_id}
        backend = Backend(models.WordLevel(vocab=vocab, unk_token=self.unk))
        backend.pre_tokenizer = pre_tokenizers.Split('', behavior='isolated')
        backend.decoder = decoders.Fuse()
        backend.add_special_tokens(list(self.special_tokens))
        return backend


def _byte_characters() -> List[str]:
    """The printable character standing for each byte value in ``tokenizers``' ByteLevel step (GPT-2's
    ``bytes_to_unicode`` table: printable Latin-1 bytes stand for themselves, the others for U+0100 onwards, in
    order)."""
    printable = set(range(ord('!'), ord('~') + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    chars, shifted = [], 0
    for byte in range(256):
        chars.append(chr(byte) if byte in printable else chr(256 + shifted))
        shifted += byte not in printable
    return chars


# ------------------------------------------------------------------------------------------- subword tokenizers

class SubwordTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers.Tokenizer`` behind the common interface.

    Args:
        backend: the ``tokenizers.Tokenizer`` (its own post-processor is not used: the template is applied here,
            the same way for every tokenizer).
        special_tokens_map: role (``pad unk cls sep mask``) -> token string; roles the vocabulary lacks are left out.
        do_lower_case: whether the backend lower-cases (recorded for ``tokenizer_config.json``; informative).
    """

    def __init__(self, backend, special_tokens_map: Mapping[str, str], do_lower_case: Optional[bool] = None):
        self.backend = backend
        self.special_tokens_map = {r: t for r, t in special_tokens_map.items()
                                   if r in CONTROL_ROLES and t is not None and backend.token_to_id(t) is not None}
        self.do_lower_case = do_lower_case
        # special tokens are matched whole in the text and skipped by decode(skip_special_tokens=True)
        backend.add_special_tokens(list(self.special_tokens_map.values()))

    @classmethod
    def from_vocab_file(cls, path: str, do_lower_case: Optional[bool] = None,
                        special_tokens_map: Optional[Mapping[str, str]] = None) -> 'SubwordTokenizer':
        """A BERT WordPiece tokenizer from a ``vocab.txt`` (one token per line, the line number is its id).

        ``do_lower_case`` None: uncased when no ordinary token of the vocabulary has an upper-case letter (BERT's
        uncased vocabularies; the cased ones hold 'The', 'Paris', ...). Lower-casing also strips accents, as BERT's
        uncased tokenizer does.
        """
        from tokenizers import Tokenizer as Backend, decoders, models, normalizers, pre_tokenizers
        vocab = models.WordPiece.read_file(path)
        if not vocab:
            raise ValueError(f'{path} holds no tokens')
        if do_lower_case is None:
            do_lower_case = _vocab_is_uncased(vocab)
        specials = dict(special_tokens_map or _guess_special_tokens(vocab))
        if 'unk' not in specials:
            raise ValueError(f'{path}: no unknown-word token ([UNK] or <unk>) in the vocabulary; WordPiece needs one')
        backend = Backend(models.WordPiece(vocab, unk_token=specials['unk']))
        backend.normalizer = normalizers.BertNormalizer(lowercase=do_lower_case)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
        return cls(backend, specials, do_lower_case)

    @classmethod
    def from_file(cls, path: str, special_tokens_map: Optional[Mapping[str, str]] = None,
                  do_lower_case: Optional[bool] = None, allow_regex: bool = False) -> 'SubwordTokenizer':
        """Any ``tokenizer.json`` of Hugging Face's ``tokenizers``; roles not given are found by their usual
        names ([PAD]/<pad>, [CLS]/<cls>/<s>, ...). One with a regular expression is refused unless ``allow_regex``
        (:func:`check_no_regex`)."""
        from tokenizers import Tokenizer as Backend
        with open(path, encoding='utf-8') as f:
            text = f.read()
        check_no_regex(json.loads(text), path, allow_regex)
        backend = Backend.from_str(text)
        specials = dict(_guess_special_tokens(backend.get_vocab(with_added_tokens=True)))
        specials.update(special_tokens_map or {})
        return cls(backend, specials, do_lower_case)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> List[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self.backend.token_to_id(token)

    def id_to_token(self, index: int) -> str:
        token = self.backend.id_to_token(index)
        if token is None:
            raise KeyError(f'id {index} outside the vocabulary of {self.vocab_size}')
        return token

    def to_dict(self) -> Dict[str, Any]:
        return {'tokenizer_type': 'subword', 'tokenizer_json': self.backend.to_str(),
                'special_tokens_map': dict(self.special_tokens_map), 'do_lower_case': self.do_lower_case}

    def _hf_backend(self):
        from tokenizers import Tokenizer as Backend
        return Backend.from_str(self.backend.to_str())  # a copy: the template is set on it, not on ours

    def _saved_fields(self) -> Dict[str, Any]:
        fields = {'tokenizer_type': 'subword'}  # the vocabulary itself is tokenizer.json
        if self.do_lower_case is not None:
            fields['do_lower_case'] = self.do_lower_case
        return fields


def _vocab_is_uncased(vocab: Iterable[str]) -> bool:
    """True when no ordinary token (not ``[...]`` / ``<...>``) has an upper-case letter."""
    special = re.compile(r'^(\[.*\]|<.*>)$')
    return not any(t != t.lower() for t in vocab if not special.match(t))


def _guess_special_tokens(vocab: Iterable[str]) -> Dict[str, str]:
    vocab = set(vocab)
    out = {}
    for role, names in _ROLE_NAMES.items():
        found = next((n for n in names if n in vocab), None)
        if found is not None:
            out[role] = found
    return out


MAX_VOCAB_SIZE = 2 ** 20  # the largest vocabularies in use are ~256k; tokenizers' trainer aborts the process
# (a Rust allocation failure, not an exception) when it reserves room for a vocabulary of 1e9 (~70 GB)


def check_vocab_size(name: str, kind: str, vocab_size: int, num_special_tokens: int = len(BERT_CONTROL_TOKENS)) -> None:
    """A ``ValueError`` (:class:`~mlp_vision.errors.UsageError`) naming ``name`` unless a ``kind`` vocabulary
    of ``vocab_size`` tokens has room for a text token beside the special ones (byte-level BPE: beside all 256
    bytes, which it always keeps) and is at most :data:`MAX_VOCAB_SIZE`."""
    base = 256 if kind == 'bpe' else 0
    why = (f'byte-level BPE keeps the 256 bytes and {num_special_tokens} special tokens' if base else
           f'room for text tokens beside the {num_special_tokens} special tokens')
    check_range(name, vocab_size, low=base + num_special_tokens + 1, why=why)
    check_range(name, vocab_size, high=MAX_VOCAB_SIZE, why='the largest vocabularies in use have ~256k tokens')


def train_tokenizer(
        texts: Optional[Iterable[str]] = None,
        files: Optional[Sequence[str]] = None,
        kind: str = 'wordpiece',
        vocab_size: int = 8000,
        lowercase: bool = True,
        min_frequency: int = 2,
        special_tokens: Mapping[str, str] = BERT_CONTROL_TOKENS,
) -> SubwordTokenizer:
    """Train a subword vocabulary offline on ``texts`` (an iterable of strings, e.g. lines) or ``files``.

    Args:
        kind: 'wordpiece' (BERT: BERT normalizer and pre-tokenizer, ``##`` continuation prefix) or 'bpe' (byte-level
            BPE as GPT-2: the 256 bytes are always in the vocabulary, so there are no unknown words).
        vocab_size: size of the result, special tokens included (an upper bound: a small corpus may give fewer).
        lowercase: lower-case (and, for WordPiece, strip accents) before training and encoding.
        min_frequency: a merge must occur this often.
        special_tokens: role -> token; they get the first ids in this order (``[PAD]`` is 0 by default).

    Reproducibility: the BPE result depends only on the corpus and these arguments. The WordPiece trainer of
    ``tokenizers`` numbers the ``##`` continuation symbols in hash order and breaks ties between equally frequent
    pairs by those numbers, so two runs can keep slightly different rare pieces: train once and save it
    (``save_pretrained``) -- e.g. on one DDP rank, the others loading the saved files.
    """
    from tokenizers import Tokenizer as Backend, decoders, models, normalizers, pre_tokenizers, trainers
    if kind not in SUBWORD_KINDS:
        raise ValueError(f'kind must be one of {SUBWORD_KINDS}, got {kind!r}')
    if (texts is None) == (files is None):
        raise ValueError('give exactly one of texts= (strings) or files= (paths)')
    specials = list(special_tokens.values())
    check_vocab_size('vocab_size', kind, vocab_size, len(specials))
    if kind == 'wordpiece':
        backend = Backend(models.WordPiece(unk_token=special_tokens.get('unk', '[UNK]')))
        backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=specials, show_progress=False)
    else:
        backend = Backend(models.BPE())
        if lowercase:
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
    return SubwordTokenizer(backend, special_tokens, lowercase)


# ---------------------------------------------------------------------------------------------------- loading

def _find_regex(node: Any, where: str = '', depth: int = 0) -> Optional[Tuple[str, Any]]:
    """(where, pattern) of the first ``{"Regex": pattern}`` in a parsed ``tokenizer.json``, or None."""
    if depth > 64:  # tokenizers' own files nest a few levels; deeper is no tokenizer
        return where or 'the file', '(nested deeper than 64 levels)'
    if isinstance(node, dict):
        if 'Regex' in node:
            return where, node['Regex']
        items = node.items()
    elif isinstance(node, list):
        items = ((f'[{i}]', v) for i, v in enumerate(node))
    else:
        return None
    if where == '' and isinstance(node, dict):  # the vocabulary and merges hold no patterns: not walked
        items = ((k, v) for k, v in items if k not in ('model', 'added_tokens'))
    for key, value in items:
        found = _find_regex(value, f'{where}.{key}' if where and not key.startswith('[') else f'{where}{key}',
                            depth + 1)
        if found is not None:
            return found
    return None


def check_no_regex(payload: Any, where: str, allow_regex: bool = False) -> None:
    """A :class:`UsageError` naming ``where`` and the field when the parsed ``tokenizer.json`` ``payload`` holds a
    regular expression (``{"Regex": ...}``: a ``Split`` or ``Replace`` normalizer / pre-tokenizer), unless
    ``allow_regex``. ``tokenizers`` matches them with a backtracking engine: a crafted pattern such as ``(a+)+$``
    takes minutes per text."""
    found = None if allow_regex else _find_regex(payload)
    if found is not None:
        field, pattern = found
        raise UsageError(f'{where}: {field} is the regular expression {short_repr(pattern, 80)}, refused: a crafted '
                         f'pattern takes minutes per text; the tokenizers this package writes use none. Load a file '
                         f'you trust with allow_regex=True (in Python)')


def tokenizer_from_dict(d: Mapping[str, Any], allow_regex: bool = False) -> Tokenizer:
    """Inverse of :meth:`Tokenizer.to_dict` (also reads the ``{"type": "char" | "byte"}`` dicts of older runs); a
    subword tokenizer with a regular expression is refused unless ``allow_regex`` (:func:`check_no_regex`)."""
    kind = d.get('tokenizer_type', d.get('type'))
    if kind == 'byte':
        return ByteTokenizer(d['special_tokens'])
    if kind == 'char':
        return CharTokenizer(d['chars'], d['special_tokens'], d.get('unk'))
    if kind == 'subword':
        from tokenizers import Tokenizer as Backend
        check_no_regex(json.loads(d['tokenizer_json']), 'the saved tokenizer', allow_regex)
        return SubwordTokenizer(Backend.from_str(d['tokenizer_json']), d['special_tokens_map'], d.get('do_lower_case'))
    raise ValueError(f'unknown tokenizer type {kind!r}; expected byte, char or subword')


def _read_json(path: str) -> Optional[dict]:
    """The JSON object of ``path`` (None when there is no such file); damaged JSON is a UsageError naming it."""
    if not os.path.isfile(path):
        return None
    return _read_tokenizer_file(path, lambda: _json_object(path))


def _json_object(path: str) -> dict:
    with open(path, encoding='utf-8') as f:
        d = json.load(f)
    if not isinstance(d, dict):
        raise ValueError(f'expected a JSON object, got a {type(d).__name__}')
    return d


def _read_tokenizer_file(path: str, read):
    """``read()`` of the tokenizer file ``path``; a damaged file, or one of another kind, is a :class:`UsageError`
    naming it (instead of a traceback from json, a missing key, or ``tokenizers``' Rust parser)."""
    try:
        return read()
    except (OSError, UsageError):
        raise  # a file that cannot be read, or another file's error: each names its file
    except Exception as e:  # json's ValueError, KeyError / TypeError of a missing field, tokenizers' plain Exception
        detail = str(e).splitlines()[0] if str(e) else ''
        raise UsageError(f'{path} is not a tokenizer file this package reads ({type(e).__name__}: {detail}); it is '
                         f'damaged, truncated or of another kind') from None


def _hf_special_tokens(directory: str) -> Dict[str, str]:
    """Roles named by ``transformers``' ``special_tokens_map.json`` / ``tokenizer_config.json`` (``cls_token``...)."""
    out = {}
    for name in ('special_tokens_map.json', TOKENIZER_CONFIG_NAME):
        d = _read_json(os.path.join(directory, name)) or {}
        for role in CONTROL_ROLES:
            value = d.get(f'{role}_token')
            if isinstance(value, dict):  # transformers' AddedToken form
                value = value.get('content')
            if isinstance(value, str):
                out[role] = value
    return out


def find_tokenizer(path: str, allow_regex: bool = False) -> Optional[Tokenizer]:
    """The tokenizer in a folder (or of a file), or None when there is none. Looked for, in order:

    * ``tokenizer_config.json`` written by :meth:`Tokenizer.save_pretrained` for a byte / char tokenizer;
    * ``tokenizer.json``: ours from older runs (``{"type": "char" | "byte"}``) or Hugging Face's, with the special
      tokens of ``tokenizer_config.json`` / ``special_tokens_map.json`` when present;
    * ``vocab.txt``: BERT WordPiece, lower-casing from ``tokenizer_config.json``'s ``do_lower_case`` when present,
      else from the vocabulary (see :meth:`SubwordTokenizer.from_vocab_file`).

    A ``tokenizer.json`` with a regular expression is refused unless ``allow_regex`` (:func:`check_no_regex`).
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        if os.path.basename(path) == VOCAB_FILE_NAME or path.endswith('.txt'):
            return _read_tokenizer_file(path, lambda: SubwordTokenizer.from_vocab_file(path))
        try:
            d = _read_json(path)
        except UsageError:  # not JSON: not a tokenizer file
            return None
        if d.get('type', d.get('tokenizer_type')) in ('byte', 'char'):
            return _read_tokenizer_file(path, lambda: tokenizer_from_dict(d))
        if 'model' not in d:  # JSON of something else (a config.json)
            return None
        return _read_tokenizer_file(path, lambda: SubwordTokenizer.from_file(path, allow_regex=allow_regex))
    if not os.path.isdir(path):
        raise FileNotFoundError(f'{path} does not exist')
    config_file = os.path.join(path, TOKENIZER_CONFIG_NAME)
    config = _read_json(config_file) or {}
    if config.get('tokenizer_type') in ('byte', 'char'):
        return _read_tokenizer_file(config_file, lambda: tokenizer_from_dict(config))
    lower = config.get('do_lower_case')
    tokenizer_file = os.path.join(path, TOKENIZER_FILE_NAME)
    if os.path.isfile(tokenizer_file):
        d = _read_json(tokenizer_file)
        if d.get('type') in ('byte', 'char'):
            return _read_tokenizer_file(tokenizer_file, lambda: tokenizer_from_dict(d))
        specials = _hf_special_tokens(path)
        return _read_tokenizer_file(tokenizer_file, lambda: SubwordTokenizer.from_file(
            tokenizer_file, specials, lower, allow_regex=allow_regex))
    vocab_file = os.path.join(path, VOCAB_FILE_NAME)
    if os.path.isfile(vocab_file):
        return _read_tokenizer_file(vocab_file, lambda: SubwordTokenizer.from_vocab_file(
            vocab_file, lower, {**_guess_special_tokens(_read_lines(vocab_file)), **_hf_special_tokens(path)}))
    return None


def _read_lines(path: str) -> List[str]:
    with open(path, encoding='utf-8') as f:
        return [line.rstrip('\n') for line in f]


def load_tokenizer(path: str, allow_regex: bool = False) -> Tokenizer:
    """As :func:`find_tokenizer`, but a folder without a tokenizer is an error."""
    tok = find_tokenizer(path, allow_regex)
    if tok is None:
        raise FileNotFoundError(f'{path} holds no tokenizer (expected {TOKENIZER_CONFIG_NAME}, {TOKENIZER_FILE_NAME} '
                                f'or {VOCAB_FILE_NAME})')
    return tok
