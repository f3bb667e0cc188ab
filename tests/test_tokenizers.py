""" mlp_vision.text.tokenizer: byte / char / subword tokenizers behind one interface.

Covers: byte and char round trips; the BERT template (pairs, token types), longest-first truncation and right
padding, with errors for what cannot be done; a BERT vocab.txt read as WordPiece (greedy longest-match-first, as
BERT's example 'unaffable' -> un ##aff ##able), cased vs uncased detection and tokenizer_config.json's
do_lower_case; offline WordPiece / BPE training (special ids first, frequent words whole, BPE deterministic with an exact round
trip);
save_pretrained / load_tokenizer / to_dict round trips and the older tokenizer.json of the text trainer. All data is
made here.
"""
import json

import pytest
import torch

import mlp_vision.text as mt
from mlp_vision.text.tokenizer import find_tokenizer, tokenizer_from_dict

CORPUS = [
    'the movie was good and the actors were great .',
    'the film was bad , the plot was boring and the ending was worse .',
    'a good film with a great cast and a good story .',
    'boring , slow and bad : the worst movie of the year .',
    'unaffable characters in an unremarkable film .',
] * 20


def bert_vocab(path, cased=False):
    words = ['the', 'movie', 'was', 'good', 'un', '##aff', '##able', '##s', 'a', '.', ',', 'film', 'great']
    if cased:
        words += ['The', 'Paris']
    specials = ['[PAD]', '[unused0]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
    path.write_text('\n'.join(specials + words) + '\n', encoding='utf-8')
    return specials + words


# ------------------------------------------------------------------------------------------------ byte / char

def test_byte_and_char_tokenizers(tmp_path):
    tok = mt.ByteTokenizer()
    text = 'Thou art — naïve, 東京!'
    ids = tok.encode(text)
    assert max(ids) < 256 and tok.decode(ids) == text
    assert tok.vocab_size == 260 and tok.special_ids == [256, 257, 258, 259]
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id, tok.unk_id) == (256, 257, 258, 259, None)
    assert tok.decode([tok.cls_id] + ids + [tok.pad_id]) == text
    assert tok.encode('<mask>') == list(b'<mask>')  # special strings in text stay text for bytes

    ct = mt.CharTokenizer.from_text('hello world', special_tokens=['<pad>', '<mask>'])
    assert ct.vocab_size == 8 + 2 and ct.chars == sorted(set('hello world'))
    assert ct.decode(ct.encode('low hello')) == 'low hello'
    with pytest.raises(KeyError):
        ct.encode('z')
    ct.save_pretrained(str(tmp_path))
    ct2 = mt.load_tokenizer(str(tmp_path))
    assert ct2.chars == ct.chars and ct2.special_tokens == ct.special_tokens
    cu = mt.CharTokenizer.from_text('abc', unk='<unk>')
    assert cu.encode('abz') == [0, 1, cu.unk_id]


def test_older_trainer_tokenizer_json_still_loads(tmp_path):
    (tmp_path / 'tokenizer.json').write_text(json.dumps(
        {'type': 'char', 'chars': 'abc ', 'special_tokens': ['<pad>', '<cls>', '<sep>', '<mask>'], 'unk': None}))
    tok = mt.load_tokenizer(str(tmp_path))
    assert isinstance(tok, mt.CharTokenizer) and tok.encode('cab') == [3, 1, 2] and tok.mask_id == 7


# ------------------------------------------------------------------------------------------------ template

def test_pairs_truncation_and_padding():
    tok = mt.ByteTokenizer()
    cls, sep, pad = tok.cls_id, tok.sep_id, tok.pad_id
    enc = tok('ab', 'xyz')
    assert enc['input_ids'] == [cls, 97, 98, sep, 120, 121, 122, sep]
    assert enc['token_type_ids'] == [0, 0, 0, 0, 1, 1, 1, 1] and enc['attention_mask'] == [1] * 8
    # longest first: 'abcdef' (6) and 'xy' (2) into 9 - 3 specials = 6 -> 4 + 2
    enc = tok('abcdef', 'xy', max_length=9, truncation=True)
    assert enc['input_ids'] == [cls, 97, 98, 99, 100, sep, 120, 121, sep]
    # ties cut the second segment: 'abc' + 'xyz' into 5 -> 3 + 2
    assert tok('abc', 'xyz', max_length=8, truncation=True)['input_ids'] == [cls, 97, 98, 99, sep, 120, 121, sep]
    batch = tok(['a', 'abc'], padding=True, return_tensors='pt')
    assert torch.equal(batch['input_ids'], torch.tensor([[cls, 97, sep, pad, pad], [cls, 97, 98, 99, sep]]))
    assert torch.equal(batch['attention_mask'], torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    fixed = tok('a', max_length=6, padding='max_length', return_tensors='pt', return_token_type_ids=False)
    assert set(fixed) == {'input_ids', 'attention_mask'} and fixed['input_ids'].shape == (1, 6)
    assert tok('ab', add_special_tokens=False)['input_ids'] == [97, 98]


def test_template_errors():
    tok = mt.ByteTokenizer()
    with pytest.raises(ValueError, match='truncation=True'):
        tok('abcdef', max_length=4, padding='max_length')
    with pytest.raises(ValueError, match='padding=True'):
        tok(['a', 'abc'], return_tensors='pt')
    with pytest.raises(ValueError, match='need max_length'):
        tok('a', truncation=True)
    with pytest.raises(ValueError, match='text_pair must match'):
        tok(['a', 'b'], ['x'])
    plain = mt.CharTokenizer.from_text('abc')  # a causal LM's tokenizer: no specials at all
    assert plain('abc')['input_ids'] == [0, 1, 2]
    with pytest.raises(ValueError, match='no separator'):
        plain('a', 'b')
    with pytest.raises(ValueError, match='no padding token'):
        plain(['a', 'ab'], padding=True)


# ------------------------------------------------------------------------------------------------ vocab.txt

def test_bert_vocab_txt_wordpiece_uncased(tmp_path):
    vocab = bert_vocab(tmp_path / 'vocab.txt')
    tok = mt.load_tokenizer(str(tmp_path))
    assert isinstance(tok, mt.SubwordTokenizer) and tok.do_lower_case is True and tok.vocab_size == len(vocab)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 2, 3, 4, 5)
    ids = tok.encode('The MOVIE was unaffable.')
    assert [tok.id_to_token(i) for i in ids] == ['the', 'movie', 'was', 'un', '##aff', '##able', '.']
    assert ids == [vocab.index(t) for t in ('the', 'movie', 'was', 'un', '##aff', '##able', '.')]
    assert tok.decode(ids) == 'the movie was unaffable.'
    assert tok.id_to_token(tok.encode('zebra')[0]) == '[UNK]'
    enc = tok('the movie', 'was good', return_tensors='pt')
    assert enc['input_ids'].tolist() == [[3, 6, 7, 4, 8, 9, 4]] and enc['token_type_ids'].tolist() == [[0] * 4 + [1] * 3]
    assert tok.encode('the [MASK] .') == [6, 5, 15]  # special tokens are recognised whole in subword text


def test_vocab_case_detection_and_tokenizer_config(tmp_path):
    bert_vocab(tmp_path / 'vocab.txt', cased=True)
    tok = mt.load_tokenizer(str(tmp_path))
    assert tok.do_lower_case is False
    assert [tok.id_to_token(i) for i in tok.encode('The the Paris')] == ['The', 'the', 'Paris']
    (tmp_path / 'tokenizer_config.json').write_text(json.dumps({'do_lower_case': True}))
    lowered = mt.load_tokenizer(str(tmp_path))  # the config overrides what the vocabulary suggests
    assert lowered.do_lower_case is True and [lowered.id_to_token(i) for i in lowered.encode('The')] == ['the']


def test_missing_tokenizer_is_reported(tmp_path):
    assert find_tokenizer(str(tmp_path)) is None
    with pytest.raises(FileNotFoundError, match='holds no tokenizer'):
        mt.load_tokenizer(str(tmp_path))
    (tmp_path / 'vocab.txt').write_text('a\nb\n')
    with pytest.raises(ValueError, match='unknown-word token'):
        mt.load_tokenizer(str(tmp_path))


# ------------------------------------------------------------------------------------------------ training

@pytest.mark.parametrize('kind', ['wordpiece', 'bpe'])
def test_train_subword_vocabulary(kind, tmp_path):
    size = 120 if kind == 'wordpiece' else 300  # byte-level BPE always holds the 256 bytes
    tok = mt.train_tokenizer(texts=CORPUS, kind=kind, vocab_size=size, min_frequency=2)
    assert tok.vocab_size == size  # this corpus has enough merges to fill it
    assert [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id] == [0, 1, 2, 3, 4]
    assert tok.special_ids == [0, 1, 2, 3, 4]
    text = 'the movie was good .'
    ids = tok.encode(text)
    assert tok.decode([ids[0]]).strip() == 'the' and len(ids) <= len(text) / 2  # merged, the most frequent word whole
    assert tok.unk_id not in ids
    assert tok.decode(ids) == (text if kind == 'bpe' else 'the movie was good.')  # BERT's decoder drops ' .'
    corpus = tmp_path / 'corpus.txt'
    corpus.write_text('\n'.join(CORPUS), encoding='utf-8')
    from_file = mt.train_tokenizer(files=[str(corpus)], kind=kind, vocab_size=size, min_frequency=2)
    tokens = [tok.id_to_token(i) for i in ids]
    assert [from_file.id_to_token(i) for i in from_file.encode(text)] == tokens
    if kind == 'bpe':
        odd = 'Zébra 東京!'  # byte level: any text, no unknown token, exact round trip
        assert tok.decode(tok.encode(odd)) == odd.lower()
        again = mt.train_tokenizer(texts=CORPUS, kind=kind, vocab_size=size, min_frequency=2)
        assert again.backend.get_vocab() == tok.backend.get_vocab()  # BPE training is deterministic
    # saved beside a checkpoint and reloaded, or through a checkpoint dict: the same ids
    tok.save_pretrained(str(tmp_path / 'ckpt'))
    for loaded in (mt.load_tokenizer(str(tmp_path / 'ckpt')), tokenizer_from_dict(tok.to_dict())):
        assert loaded.encode(text) == ids and loaded.special_tokens_map == tok.special_tokens_map
        assert loaded('the movie', 'was good') == tok('the movie', 'was good')


def test_train_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match='kind must be'):
        mt.train_tokenizer(texts=CORPUS, kind='unigram')
    with pytest.raises(ValueError, match='exactly one'):
        mt.train_tokenizer()
    with pytest.raises(ValueError, match='vocab_size must be >= 6 .room for text tokens'):
        mt.train_tokenizer(texts=CORPUS, vocab_size=5)
    with pytest.raises(ValueError, match='must be >= 262 .byte-level BPE keeps the 256 bytes'):
        mt.train_tokenizer(texts=CORPUS, kind='bpe', vocab_size=200)
    with pytest.raises(FileNotFoundError):
        mt.train_tokenizer(files=[str(tmp_path / 'missing.txt')])
