""" Tokenizers that need no download: UTF-8 bytes, or the characters of a corpus.

* :class:`ByteTokenizer` -- ids 0..255 are the UTF-8 bytes, special tokens follow (256, 257, ...). Covers any
  text with a fixed vocabulary; the default specials (``<pad> <cls> <sep> <mask>``) serve masked LM and the
  BERT ``<cls>`` protocol.
* :class:`CharTokenizer` -- one id per distinct character of a corpus, in sorted order (ids 0..C-1), special
  tokens after them. Without specials it reproduces nanoGPT's / the MLP-Attention paper's Tiny Shakespeare
  vocabulary (65 characters). Save it with the model (``save``/``load``) since the vocabulary is data-derived.

Special tokens are never produced by ``encode`` from text; insert them by id (``token_to_id('<cls>')``).
"""
import json
import os
from typing import Dict, Iterable, List, Optional, Sequence

__all__ = ['ByteTokenizer', 'CharTokenizer', 'DEFAULT_SPECIAL_TOKENS']

DEFAULT_SPECIAL_TOKENS = ('<pad>', '<cls>', '<sep>', '<mask>')


class _SpecialsMixin:
    special_tokens: Sequence[str]
    _base_size: int

    def _init_specials(self, special_tokens: Iterable[str]) -> None:
        self.special_tokens = tuple(special_tokens)
        if len(set(self.special_tokens)) != len(self.special_tokens):
            raise ValueError(f'duplicate special tokens: {self.special_tokens}')
        self._special_to_id: Dict[str, int] = {t: self._base_size + i for i, t in enumerate(self.special_tokens)}

    @property
    def vocab_size(self) -> int:
        return self._base_size + len(self.special_tokens)

    def token_to_id(self, token: str) -> int:
        """Id of a special token (e.g. ``'<mask>'``)."""
        return self._special_to_id[token]

    def _opt(self, token: str) -> Optional[int]:
        return self._special_to_id.get(token)

    @property
    def pad_id(self) -> Optional[int]:
        return self._opt('<pad>')

    @property
    def cls_id(self) -> Optional[int]:
        return self._opt('<cls>')

    @property
    def sep_id(self) -> Optional[int]:
        return self._opt('<sep>')

    @property
    def mask_id(self) -> Optional[int]:
        return self._opt('<mask>')

    @property
    def special_ids(self) -> List[int]:
        return list(self._special_to_id.values())


class ByteTokenizer(_SpecialsMixin):
    """UTF-8 byte tokenizer: ``vocab_size = 256 + len(special_tokens)``.

    ``decode`` drops special ids and replaces invalid UTF-8 (e.g. a sequence cut inside a character) with U+FFFD.
    """

    def __init__(self, special_tokens: Iterable[str] = DEFAULT_SPECIAL_TOKENS):
        self._base_size = 256
        self._init_specials(special_tokens)

    def encode(self, text: str) -> List[int]:
        return list(text.encode('utf-8'))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode('utf-8', errors='replace')

    def __repr__(self) -> str:
        return f'ByteTokenizer(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})'


class CharTokenizer(_SpecialsMixin):
    """Character tokenizer over a fixed alphabet (sorted), specials after it.

    Args:
        chars: the alphabet (duplicates removed, sorted).
        special_tokens: appended after the characters.
        unk: if given, a special token (added when missing) that unknown characters map to; otherwise
            ``encode`` raises ``KeyError`` on a character outside the alphabet.
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
        self._stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str, special_tokens: Iterable[str] = (), unk: Optional[str] = None) -> 'CharTokenizer':
        """Alphabet = the distinct characters of ``text``."""
        return cls(set(text), special_tokens, unk)

    def encode(self, text: str) -> List[int]:
        if self.unk is None:
            return [self._stoi[c] for c in text]
        unk_id = self.token_to_id(self.unk)
        return [self._stoi.get(c, unk_id) for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        n = self._base_size
        return ''.join(self.chars[i] for i in ids if 0 <= i < n)

    def save(self, path: str) -> None:
        """Write the alphabet and specials as JSON (``path`` may be a directory: ``tokenizer.json`` inside)."""
        if os.path.isdir(path):
            path = os.path.join(path, 'tokenizer.json')
        with open(path, 'w', encoding='utf-8') as f:
            json.dump({'type': 'char', 'chars': ''.join(self.chars), 'special_tokens': list(self.special_tokens),
                       'unk': self.unk}, f, ensure_ascii=False)

    @classmethod
    def load(cls, path: str) -> 'CharTokenizer':
        if os.path.isdir(path):
            path = os.path.join(path, 'tokenizer.json')
        with open(path, encoding='utf-8') as f:
            d = json.load(f)
        return cls(d['chars'], d['special_tokens'], d['unk'])

    def __repr__(self) -> str:
        return f'CharTokenizer(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})'
