""" The text of the trainer's causal and masked LM runs: UTF-8 files read with one clear line for bad input, the
run's tokenizer, the text encoded in pieces (a stop signal read between them) and cut into blocks (:class:`LMBlocks`,
the tail shorter than a block dropped), masked LM blocks masked anew each epoch (:class:`MaskedBlocks`); batched by
``transformers.default_data_collator`` (one length: nothing to pad).
"""
import json
import logging
import re
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from mlp_vision.errors import Interrupted, UsageError
from mlp_vision.text.tokenizer import (
    DEFAULT_CONTROL_TOKENS, SUBWORD_KINDS, Tokenizer, byte_tokenizer, char_tokenizer, find_tokenizer, tokenizer_kind,
    train_tokenizer, unknown_character)

__all__ = [
    'build_tokenizer', 'tokenizer_from_path', 'encode_text', 'check_unknown_tokens', 'read_text_file', 'LMBlocks',
    'MaskedBlocks', 'UNKNOWN_WARN_FRACTION',
]

_logger = logging.getLogger(__name__)

UNK = '<unk>'


def build_tokenizer(kind: str, task: str, train_text: str, val_text: str = '', vocab_size: int = 8000) -> Tokenizer:
    """The tokenizer of a run: ``char`` (alphabet of ``train_text``, so Tiny Shakespeare gives the papers' 65
    characters; ``<unk>`` only when ``val_text`` has others) or ``byte`` (256), mlm / classify adding ``<pad> <cls>
    <sep> <mask>`` after them; or a ``wordpiece`` / ``bpe`` vocabulary of at most ``vocab_size`` tokens trained on
    the lines of ``train_text`` (:func:`~mlp_vision.text.tokenizer.train_tokenizer`)."""
    if kind in SUBWORD_KINDS:
        tokenizer = train_tokenizer(texts=_training_lines(train_text), kind=kind, vocab_size=vocab_size)
        if len(tokenizer) < vocab_size:  # the trainer stops when no pair is frequent enough to merge
            _logger.warning(f'--vocab-size {vocab_size}: the {kind} vocabulary trained on the training text has only '
                            f'{len(tokenizer)} tokens (the text has no more pieces that occur twice)')
        return tokenizer
    specials = () if task == 'causal' else tuple(DEFAULT_CONTROL_TOKENS)  # mlm / classify: BERT's template
    if kind == 'byte':
        return byte_tokenizer(specials)
    if kind != 'char':
        raise UsageError(f'--tokenizer must be char, byte, wordpiece or bpe; got {kind!r}')
    alphabet = set(train_text)
    unseen = set(val_text) - alphabet
    if unseen:
        count = sum(c in unseen for c in val_text)
        _logger.info(f'char tokenizer: {len(unseen)} characters of the validation text ({count} occurrences) '
                     f'are not in the training text; they map to {UNK}')
    return char_tokenizer(alphabet, specials, unk=UNK if unseen else None)


def tokenizer_from_path(path: str, needs: Sequence[str] = (), allow_regex: bool = False) -> Tokenizer:
    """``--tokenizer-from PATH``: the tokenizer of a folder or file (``tokenizer.json``, BERT ``vocab.txt``), so that
    runs share one vocabulary exactly. ``needs``: control tokens the task uses (``'cls'``, ``'sep'``, ``'pad'``,
    ``'mask'``; one missing is a :class:`UsageError`); ``allow_regex``: ``--allow-regex``."""
    if not Path(path).exists():
        raise UsageError(f'--tokenizer-from {path} does not exist')
    tokenizer = find_tokenizer(path, allow_regex)
    if tokenizer is None:
        raise UsageError(f'--tokenizer-from {path} holds no tokenizer (tokenizer_config.json, tokenizer.json or '
                         f'vocab.txt)')
    missing = [name for name in needs if getattr(tokenizer, f'{name}_token_id') is None]
    if missing:
        raise UsageError(f'--tokenizer-from {path}: this task needs the {", ".join(f"<{n}>" for n in needs)} '
                         f'tokens; the tokenizer lacks {", ".join(f"<{n}>" for n in missing)}')
    return tokenizer


# a text is tokenized in pieces of about this many characters, the stop signal read between them; a piece's
# encodings (~70 bytes per token: ids, tokens, masks) are freed before the next
ENCODE_CHUNK_CHARS = 1 << 18
# the longest piece given to the library in one call (a 100 MB line aborts the process in an allocation failure)
MAX_PIECE_CHARS = 1 << 22
# a line break, or the place before a space, between two non-space characters: no normalizer / pre-tokenizer that
# works within words joins tokens across it (GPT-2's pattern takes a space with the word after it), so the pieces'
# ids are the whole text's (tests/test_bounds.py checks WordPiece and BPE)
_SAFE_BREAK = re.compile(r'(?<=\S)\n(?=\S)|(?<=\S)(?= \S)')
# the parts of a tokenizer.json that keep that true: they act within a character, a word or a line
_LINE_LOCAL_STEPS = {'BertNormalizer', 'Lowercase', 'NFC', 'NFD', 'NFKC', 'NFKD', 'StripAccents', 'BertPreTokenizer',
                     'Whitespace', 'WhitespaceSplit', 'Punctuation', 'Digits', 'Sequence'}
# any other tokenizer (GPT-2's byte-level BPE adds a space before a text, SentencePiece's Metaspace a word-start mark)
# is cut at a _SAFE_BREAK only where the CUT_CHECK_CHARS either side keep their ids; after CUT_TRIES failed places the
# rest of the text is encoded in one call
CUT_CHECK_CHARS, CUT_TRIES = 2048, 32


def _encodes_by_pieces(tok: Tokenizer) -> bool:
    """Whether ``tok`` gives a text's ids when it encodes the text's pieces (split at :data:`_SAFE_BREAK`) one by
    one: byte / char tokenizers, and subword ones whose normalizer and pre-tokenizer are line-local."""
    if tokenizer_kind(tok) in ('byte', 'char'):
        return True
    payload = json.loads(tok.backend_tokenizer.to_str())

    def local(step) -> bool:
        if step is None:
            return True
        kind = step.get('type')
        if kind == 'ByteLevel':
            return not step.get('add_prefix_space', True)  # with it, each piece would get a leading space
        parts = step.get('normalizers') or step.get('pretokenizers') or []
        return kind in _LINE_LOCAL_STEPS and all(local(p) for p in parts)
    return local(payload.get('normalizer')) and local(payload.get('pre_tokenizer'))


def _cut_keeps_ids(tok: Tokenizer, text: str, cut: int) -> bool:
    """Whether encoding the text on either side of ``cut`` apart gives the ids of encoding it whole, on the
    :data:`CUT_CHECK_CHARS` characters either side (the window's own ends are the same in both encodings)."""
    left, right = text[max(0, cut - CUT_CHECK_CHARS):cut], text[cut:cut + CUT_CHECK_CHARS]
    def encode(t: str) -> List[int]:
        return tok.encode(t, add_special_tokens=False)
    return encode(left + right) == encode(left) + encode(right)


def _pieces(text: str, size: int, what: str, tok: Optional[Tokenizer] = None, cut_anywhere: bool = False,
            first_line: int = 1) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, none over :data:`MAX_PIECE_CHARS` (else a
    :class:`UsageError` naming the line): cut at :data:`_SAFE_BREAK` (``tok`` None: a line-local tokenizer;
    ``cut_anywhere``: a byte / char one, cut at ``size`` when no break is near), else at the first
    :data:`_SAFE_BREAK` where :func:`_cut_keeps_ids`."""
    start = 0
    while len(text) - start > size:
        if tok is None:
            found = _SAFE_BREAK.search(text, start + size, start + MAX_PIECE_CHARS)
            cut = start + size if found is None and cut_anywhere else None if found is None else found.end()
        else:
            places = (m.end() for _, m in zip(range(CUT_TRIES), _SAFE_BREAK.finditer(text, start + size)))
            cut = next((c for c in places if _cut_keeps_ids(tok, text, c)), None)
        if cut is None and len(text) - start > MAX_PIECE_CHARS:  # name the line (of a text from line first_line)
            line_start = text.rfind('\n', 0, start + size + 1) + 1
            line_end = text.find('\n', start + size)
            length = (len(text) if line_end < 0 else line_end) - line_start
            raise UsageError(f'line {text.count(chr(10), 0, line_start) + first_line:,} of the {what} has {length:,} '
                             f'characters and no place this tokenizer can be cut (a line break or a space between '
                             f'words) within {MAX_PIECE_CHARS:,}, the most tokenized in one call; break the text '
                             f'into lines, or use --tokenizer char or byte')
        if cut is None:  # the stop flag is read again only after this call: say so, with the size
            _logger.warning(f'tokenizing the last {len(text) - start:,} characters in one call: this tokenizer has '
                            f'no place among the next {CUT_TRIES} candidates where a cut keeps the ids, so a stop '
                            f'signal takes effect when the call returns')
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


def _training_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` for a subword trainer, a line over :data:`ENCODE_CHUNK_CHARS` in pieces cut before a
    space between words (its words, so the vocabulary, are the same; the trainer holds ~65 bytes per character of
    a line: a 100 MB line aborted the process)."""
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) <= ENCODE_CHUNK_CHARS:
            yield line
        else:
            yield from _pieces(line, ENCODE_CHUNK_CHARS, 'training text', first_line=number)


# a byte / char tokenizer's ids are per character, so any cut keeps them: a piece goes to the library as parts of
# this many characters, encoded in one parallel call without offsets (tokenizers' encode_batch_fast), 3-6x faster
# than one encode of the piece (results/tokenizers/encode_speed.md)
CHARACTER_PART_CHARS = 1 << 16


def _encode_piece(tok: Tokenizer, piece: str) -> torch.Tensor:
    """The ids of ``piece`` without special tokens added, as ``tok.encode(piece, add_special_tokens=False)``, int32."""
    backend = tok.backend_tokenizer
    backend.encode_special_tokens = tok.split_special_tokens  # what PreTrainedTokenizerFast.encode sets per call
    if tokenizer_kind(tok) in ('byte', 'char'):
        parts = [piece[i:i + CHARACTER_PART_CHARS] for i in range(0, len(piece), CHARACTER_PART_CHARS)]
    else:
        parts = [piece]
    encodings = backend.encode_batch_fast(parts, add_special_tokens=False)
    return torch.cat([torch.tensor(e.ids, dtype=torch.int32) for e in encodings])


def encode_text(tok: Tokenizer, text: str, what: str, stop: Optional[Callable[[], int]] = None) -> torch.Tensor:
    """``text`` as a 1-D int32 tensor of ids (:class:`LMBlocks` gives int64 blocks), the tokenizer's truncation
    and padding turned off; an unknown character is a :class:`UsageError` naming ``what``. Encoded in pieces of
    :data:`ENCODE_CHUNK_CHARS` characters (:func:`_pieces`: their ids are the whole text's) into one buffer, so the
    memory beyond the text and its ids is one piece's; ``stop``: the run's stop flag (a signal number, 0 for none),
    read between pieces (:class:`~mlp_vision.errors.Interrupted`)."""
    _turn_off_length_settings(tok, what)
    characters = tokenizer_kind(tok) in ('byte', 'char')
    pieces = _pieces(text, ENCODE_CHUNK_CHARS, what, None if _encodes_by_pieces(tok) else tok,
                     cut_anywhere=characters)
    # a token per character (char: exact; byte: grown for non-ASCII text), subword tokens a few characters each:
    # one buffer, not a list of pieces joined at the end, which would hold the ids twice
    ids, count = torch.empty(len(text) if characters else len(text) // 4 + 1, dtype=torch.int32), 0
    for piece in pieces:
        signum = stop() if stop is not None else 0
        if signum:
            raise Interrupted(signum, f'tokenizing the {what} ({count} tokens so far)')
        try:
            piece_ids = _encode_piece(tok, piece)
        except Exception as e:  # tokenizers' plain Exception: a character outside a char alphabet without <unk>
            raise UsageError(f'the {what} has character {unknown_character(tok, [piece], e)!r}, which the tokenizer '
                             f'(from the checkpoint or the training text) does not know') from None
        if count + len(piece_ids) > len(ids):  # the storage grows in place, its ids kept
            ids.resize_(max(count + len(piece_ids), len(ids) * 3 // 2))
        ids[count:count + len(piece_ids)] = piece_ids
        count += len(piece_ids)
    return ids if count == len(ids) else ids[:count].clone()


def _turn_off_length_settings(tok: Tokenizer, what: str) -> None:
    """A tokenizer.json may carry truncation or padding; on a corpus they would leave a few tokens, or pad tokens by
    the thousand: both are turned off (the corpus is encoded whole and cut into blocks), in one line."""
    backend = tok.backend_tokenizer
    truncation, padding = backend.truncation, backend.padding
    settings = ([f'truncation to {truncation["max_length"]} tokens'] if truncation else []) + (
        [f'padding to {padding["length"]} tokens' if padding.get('length') else 'padding'] if padding else [])
    if not settings:
        return
    _logger.warning(f'the tokenizer\'s {" and ".join(settings)} (set in its tokenizer.json) turned off: the {what} is '
                    f'encoded whole and cut into --block-size blocks')
    backend.no_truncation()
    backend.no_padding()


# a corpus with more unknown tokens than this fraction is reported (all of them: an error)
UNKNOWN_WARN_FRACTION = 0.5


def check_unknown_tokens(ids: Sequence[int], tok: Tokenizer, what: str) -> None:
    """Warn when more than :data:`UNKNOWN_WARN_FRACTION` of ``ids`` (other special tokens not counted) are the
    unknown token; a :class:`UsageError` when all are (a model of ``[UNK] [UNK] ...`` learns nothing, silently)."""
    unk = tok.unk_token_id
    if unk is None:
        return
    ids = torch.as_tensor(ids).flatten()  # in its own dtype: a long copy of a corpus's ids would double them
    others = [i for i in tok.all_special_ids if i != unk]
    if others:
        ids = ids[~torch.isin(ids, torch.tensor(others, dtype=ids.dtype))]
    n, unknown = len(ids), int((ids == unk).sum())
    if n and unknown == n:
        raise UsageError(f'the {what} tokenizes entirely to {tok.unk_token} ({n} tokens): the tokenizer knows none '
                         f'of it; expected a tokenizer of text like it (--tokenizer-from / --init-from / --tokenizer)')
    if n and unknown > UNKNOWN_WARN_FRACTION * n:
        _logger.warning(f'the {what}: {unknown / n:.0%} of its {n} tokens are {tok.unk_token} (unknown to the '
                        f'tokenizer); the model learns little from them: check that the tokenizer fits this text')


def read_text_file(path: str, what: str, encoding: str = 'utf-8') -> str:
    """The text of ``path``; a :class:`UsageError` when none is given, it is missing, not a file, not UTF-8 or
    empty."""
    if not path:
        raise UsageError(f'no {what} given' + ('' if what.startswith('--') else ' (--train-file PATH)'))
    p = Path(path)
    if not p.is_file():
        raise UsageError(f'{what} {path!r} ' + ('is not a file' if p.exists() else 'does not exist'))
    try:
        text = p.read_text(encoding=encoding)
    except UnicodeDecodeError as e:
        raise UsageError(f'{what} {path!r} is not UTF-8 text (byte {e.start})') from None
    if not text.strip():
        raise UsageError(f'{what} {path!r} is empty')
    return text


class LMBlocks(torch.utils.data.Dataset):
    """The examples of ``--task causal`` (``input_ids`` = ``labels``, (block_size,): the models shift) or ``mlm``
    (``input_ids``: ``<cls>`` + ``block_size - 2`` tokens + ``<sep>``) cut from the 1-D ``ids`` in order, made as
    they are read: a list of a million blocks' tensors would hold ~0.5 KB of Python objects per block beside the
    ids. ``ids`` without a whole block are a :class:`UsageError` naming ``what``."""

    def __init__(self, ids: torch.Tensor, block_size: int, task: str, tokenizer: Tokenizer, what: str):
        body = block_size if task == 'causal' else block_size - 2
        if len(ids) < body:
            raise UsageError(f'the {what} has {len(ids)} tokens, fewer than one block of {body}; use a longer text '
                             f'or a smaller --block-size')
        self.blocks = ids[:len(ids) // body * body].view(-1, body)
        self.causal = task == 'causal'
        self.cls, self.sep = (None, None) if self.causal else (tokenizer.cls_token_id, tokenizer.sep_token_id)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        block = self.blocks[i].long()
        if self.causal:
            return {'input_ids': block, 'labels': block}
        return {'input_ids': torch.cat([block.new_tensor([self.cls]), block, block.new_tensor([self.sep])])}


class MaskedBlocks(torch.utils.data.Dataset):
    """MLM blocks (``LMBlocks``' ``input_ids``) with BERT's masking (arXiv 1810.04805 §3.1, :meth:`mask`): item ``i``
    is ``input_ids`` and ``labels`` drawn from a generator seeded by (``seed``, ``epoch``, ``i``); Trainer sets
    ``epoch`` at each epoch's start (:class:`~mlp_vision.text.callbacks.DatasetEpoch`), so each epoch masks anew
    (RoBERTa's dynamic masking) and the held-out blocks (epoch 0) are masked alike at every evaluation.

    Ours, not ``DataCollatorForLanguageModeling``, deliberately: that collator draws from the global RNG, and the
    data loader collates one batch ahead, so the batch after a checkpoint is masked before the checkpoint's RNG
    state is taken in an uninterrupted run and after it is restored in a resumed one -- different masks, a resume
    that is not exact. Here the masks depend on nothing but the three numbers."""

    def __init__(self, blocks: Sequence[Dict], tokenizer: Tokenizer, rate: float, seed: int, mask_prob: float = 0.8,
                 random_prob: float = 0.1):
        if tokenizer.mask_token_id is None:
            raise ValueError('masked LM needs a tokenizer with a <mask> token')
        self.blocks, self.seed, self.epoch = blocks, seed, 0
        self.mask_id = tokenizer.mask_token_id
        self.special_ids = torch.tensor(tokenizer.all_special_ids, dtype=torch.long)
        # random replacements are drawn from the non-special ids (char / byte: 0..n-1, the specials come after;
        # a subword vocabulary puts its specials first, BERT's at 0 and 100-103)
        is_base = torch.ones(len(tokenizer), dtype=torch.bool)
        is_base[self.special_ids] = False
        self.base_ids = is_base.nonzero().squeeze(1)
        self.rate, self.mask_prob, self.random_prob = rate, mask_prob, random_prob

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(hash((self.seed, self.epoch, i)) & (2 ** 63 - 1))
        inputs, labels = self.mask(self.blocks[i]['input_ids'][None], generator)
        return {'input_ids': inputs[0], 'labels': labels[0]}

    def mask(self, input_ids: torch.Tensor, generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, L) ids -> (masked input ids, labels): of the non-special positions of each row exactly
        ``max(1, round(rate * n))`` are selected; one becomes ``<mask>`` with probability ``mask_prob``, a random
        non-special token with ``random_prob``, else stays. Labels: the original ids there, -100 elsewhere."""
        candidate = ~torch.isin(input_ids, self.special_ids)
        n_candidates = candidate.sum(dim=1)
        n_select = torch.clamp((n_candidates.double() * self.rate).round().long(), min=1)
        n_select = torch.minimum(n_select, n_candidates)
        scores = torch.rand(input_ids.shape, generator=generator)
        scores = scores.masked_fill(~candidate, 2.)  # specials sort last: never selected
        rank = scores.argsort(dim=1).argsort(dim=1)
        selected = rank < n_select[:, None]
        labels = input_ids.masked_fill(~selected, -100)
        action = torch.rand(input_ids.shape, generator=generator)
        random_tokens = self.base_ids[torch.randint(len(self.base_ids), input_ids.shape, generator=generator)]
        out = input_ids.clone()
        to_mask = selected & (action < self.mask_prob)
        to_random = selected & (action >= self.mask_prob) & (action < self.mask_prob + self.random_prob)
        out[to_mask] = self.mask_id
        out[to_random] = random_tokens[to_random]
        return out, labels
