""" transformers' Auto classes and pipelines on our saved folders: our classes are transformers classes, registered
with the Auto classes by mlp_vision.text.registry (issue 27 item 4, issue 35 item 1).

Every comparison is with our own entry points on the same folder: ``mt.from_pretrained`` (logits, bit-identical),
the softmax of our model's logits at each mask (token ids, strings and scores, bit-identical) and our classifier's argmax
(labels; the text-classification pipeline's softmax is NumPy's, so its scores are compared to 1e-6). Tiny random
models; the tokenizer is a WordPiece trained here on generated sentences.
"""
import inspect

import pytest
import torch

import mlp_vision.text as mt
import transformers
from transformers import (
    AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification,
    AutoTokenizer, pipeline)

from mlp_vision.errors import UsageError


SUBJECTS = ['the movie', 'the film', 'the plot', 'the actors', 'this story']
WORDS = 'good great fine bad awful dull slow long short'.split()
LABEL_NAMES = ['negative', 'neutral', 'positive']
TEXTS = ['the movie was good .', 'a dull and slow film', 'the actors were great but the plot was bad']
TINY = dict(hidden_size=16, num_hidden_layers=2, intermediate_size=32, max_position_embeddings=32)
# registry name, family-specific config fields (tokenizer-dependent ones are added in _create)
MASKED_LMS = {
    'gmlp': ('gmlp_base', {}),
    'amlp': ('amlp_base', {'tiny_attention_size': 8}),
    'bigs': ('bigs_small', {'num_ssm_states': 4}),
    'bert': ('bert_small', {'num_attention_heads': 2}),
}


@pytest.fixture(scope='module')
def tokenizer():
    g = torch.Generator().manual_seed(0)
    corpus = []
    for _ in range(200):
        subject = SUBJECTS[int(torch.randint(len(SUBJECTS), (1,), generator=g))]
        words = [WORDS[i] for i in torch.randint(len(WORDS), (2,), generator=g).tolist()]
        corpus.append(f'{subject} was {words[0]} and {words[1]} .')
    return mt.train_tokenizer(texts=corpus, kind='wordpiece', vocab_size=100)


def _create(key, tokenizer, task=None, **extra):
    name, fields = MASKED_LMS[key]
    fields = {**TINY, **fields, 'vocab_size': tokenizer.vocab_size, **extra}
    if key in ('bigs', 'bert'):
        fields['pad_token_id'] = tokenizer.pad_token_id
    torch.manual_seed(0)
    return mt.create_model(name, task=task, **fields)


@torch.no_grad()
def _fill_mask(model, tokenizer, text, top_k):
    """Our model's ``top_k`` (id, token, probability) at each mask of ``text``: one list per mask, best first."""
    ids = tokenizer(text, split_special_tokens=False, return_tensors='pt')['input_ids']
    probs = model.eval()(ids).logits[0, ids[0] == tokenizer.mask_token_id].softmax(-1)
    return [[(i, tokenizer.decode([i]), p) for p, i in zip(*(t.tolist() for t in row.topk(top_k)))] for row in probs]


def _batch(tokenizer, texts, token_types=True):
    return tokenizer(texts, padding=True, return_tensors='pt', return_token_type_ids=token_types)


@pytest.mark.parametrize('key', list(MASKED_LMS))
def test_masked_lm_through_auto_classes_and_fill_mask_pipeline(key, tokenizer, tmp_path, single_thread):
    ours_saved = _create(key, tokenizer)
    ours_saved.save_pretrained(str(tmp_path), tokenizer=tokenizer)
    folder = str(tmp_path)

    config = AutoConfig.from_pretrained(folder)
    assert type(config) is type(ours_saved.config)
    assert config.text_fields() == ours_saved.config.text_fields()
    assert config.architectures == [type(ours_saved).__name__]

    ours = mt.from_pretrained(folder).eval()
    theirs = AutoModelForMaskedLM.from_pretrained(folder)
    assert type(theirs) is type(ours) and isinstance(theirs, transformers.PreTrainedModel) and not theirs.training
    batch = _batch(tokenizer, TEXTS)  # padded, with token types (which gMLP ignores)
    with torch.no_grad():
        assert torch.equal(theirs(**batch).logits, ours(**batch).logits)
        # the encoder (AutoModel) of the masked-LM folder is our model's encoder, weights included
        encoder = AutoModel.from_pretrained(folder)
        ours_encoder = ours.base_model
        assert type(encoder) is type(ours_encoder)
        assert torch.equal(encoder(**batch).last_hidden_state, ours_encoder(**batch).last_hidden_state)

    hf_tokenizer = AutoTokenizer.from_pretrained(folder)
    fill = pipeline('fill-mask', model=theirs, tokenizer=hf_tokenizer, top_k=5)
    for text in ('the movie was [MASK] .', 'the [MASK] was great'):
        assert [(p['token'], p['token_str'], p['score']) for p in fill(text)] == \
            _fill_mask(ours, ours.tokenizer, text, 5)[0]


def test_pipeline_loads_the_folder_by_name(tokenizer, tmp_path, single_thread):
    """pipeline(task, model=<folder>) finds the model class, the tokenizer and the weights itself."""
    model = _create('gmlp', tokenizer)
    model.save_pretrained(str(tmp_path), tokenizer=tokenizer)
    got = pipeline('fill-mask', model=str(tmp_path))('the plot was [MASK] .', top_k=3)
    expected = _fill_mask(mt.from_pretrained(str(tmp_path)), tokenizer, 'the plot was [MASK] .', 3)[0]
    assert [(p['token'], p['score']) for p in got] == [(i, p) for i, _, p in expected]


@torch.no_grad()
def _separate_labels(classifier, tokenizer):
    """A random classifier scores every text alike (a random encoder's features hardly depend on the text). Set the
    head so that text i's logits are 10 e_i (least squares through the pseudo-inverse of the three feature rows),
    whatever the tokenizer's vocabulary came out as: text i gets label i."""
    features = []
    hook = classifier.classifier.register_forward_hook(lambda module, args, out: features.append(args[0]))
    classifier.eval()(**_batch(tokenizer, TEXTS, 'token_type_ids' in _forward_arguments(classifier)))
    hook.remove()
    feats = features[0].double()  # (3, hidden)
    classifier.classifier.weight.copy_(10 * torch.linalg.pinv(feats.T))  # W feats.T = 10 I
    classifier.classifier.bias.zero_()


def _forward_arguments(model):
    return inspect.signature(model.forward).parameters


@pytest.mark.parametrize('key', ['gmlp', 'bigs', 'bert'])
def test_sequence_classifier_through_auto_class_and_text_classification_pipeline(key, tokenizer, tmp_path,
                                                                                   single_thread):
    ours = _create(key, tokenizer, task='sequence_classification', num_labels=3, classifier_dropout=0.0,
                   classifier_pooling='mean', id2label=dict(enumerate(LABEL_NAMES)))
    _separate_labels(ours, tokenizer)
    ours.save_pretrained(str(tmp_path), tokenizer=tokenizer)
    folder = str(tmp_path)

    config = AutoConfig.from_pretrained(folder)
    assert config.id2label == dict(enumerate(LABEL_NAMES)) and config.num_labels == 3
    theirs = AutoModelForSequenceClassification.from_pretrained(folder)
    ours = mt.from_pretrained(folder).eval()
    reads_token_types = key != 'gmlp'  # gMLP has no segment embedding (it ignores token types)
    batch = _batch(tokenizer, TEXTS, token_types=reads_token_types)
    with torch.no_grad():
        assert torch.equal(theirs(**batch).logits, ours(**batch).logits)
        ours_probs = [ours(**_batch(tokenizer, [t], reads_token_types)).logits[0].softmax(-1) for t in TEXTS]
    expected = [LABEL_NAMES[int(p.argmax())] for p in ours_probs]
    assert expected == LABEL_NAMES  # text i -> label i (_separate_labels)

    classify = pipeline('text-classification', model=theirs, tokenizer=AutoTokenizer.from_pretrained(folder))
    got = classify(TEXTS)
    assert [r['label'] for r in got] == expected
    assert [r['score'] for r in got] == pytest.approx([float(p.max()) for p in ours_probs], rel=1e-6)
    every = classify(TEXTS[0], top_k=None)  # every label, best first
    assert {r['label']: r['score'] for r in every} == pytest.approx(
        dict(zip(LABEL_NAMES, ours_probs[0].tolist())), rel=1e-6)


def test_classifier_written_by_the_text_trainer(tokenizer, tmp_path, single_thread):
    """The trainer's classify task (from an MLM folder with a WordPiece) writes its run folder with the label names
    (sorted training labels) in config.id2label: the pipeline's."""
    import mlp_vision.train_text as text_train
    mlm = tmp_path / 'mlm'
    _create('gmlp', tokenizer).save_pretrained(str(mlm), tokenizer=tokenizer)
    rows = ['sentence\tlabel'] + [f'the movie was {w} .\t{"pos" if w in ("good", "great", "fine") else "neg"}'
                                  for w in WORDS for _ in range(2)]
    (tmp_path / 'train.tsv').write_text('\n'.join(rows) + '\n')
    text_train.main(['--task', 'classify', '--init-from', str(mlm), '--train-file', str(tmp_path / 'train.tsv'),
                     '--val-file', str(tmp_path / 'train.tsv'), '--steps', '2', '-b', '4', '--eval-interval', '2',
                     '--threads', '1', '--log-interval', '1000', '--device', 'cpu', '--output',
                     str(tmp_path / 'out'), '--experiment', 'cls'])
    folder = str(tmp_path / 'out' / 'cls')
    theirs = AutoModelForSequenceClassification.from_pretrained(folder)
    assert theirs.config.id2label == {0: 'neg', 1: 'pos'}
    ours = mt.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = [['neg', 'pos'][int(ours(**_batch(tokenizer, [t], False)).logits.argmax())] for t in TEXTS]
    got = pipeline('text-classification', model=theirs, tokenizer=AutoTokenizer.from_pretrained(folder))(TEXTS)
    assert [r['label'] for r in got] == expected


def test_single_output_classifier_is_regression(tokenizer, tmp_path):
    ours = _create('gmlp', tokenizer, task='sequence_classification', num_labels=1)
    ours.save_pretrained(str(tmp_path), tokenizer=tokenizer)
    theirs = AutoModelForSequenceClassification.from_pretrained(str(tmp_path))
    assert theirs.config.problem_type == 'regression'  # our 1-output head is trained with MSE: no sigmoid
    got = pipeline('text-classification', model=theirs, tokenizer=tokenizer)(TEXTS[0])
    with torch.no_grad():
        expected = mt.from_pretrained(str(tmp_path)).eval()(**_batch(tokenizer, [TEXTS[0]], False)).logits
    assert got[0]['score'] == pytest.approx(float(expected), rel=1e-6)


CAUSAL_LMS = {
    'gpt_mlp_attention': dict(num_attention_heads=2, mlp_attention_hidden_size=8),
    'gpt_sdpa': dict(num_attention_heads=2),
    'gmlp_causal_char': {},
}


@pytest.mark.parametrize('name', list(CAUSAL_LMS))
def test_causal_lm_through_auto_class_and_generate(name, tmp_path, single_thread):
    torch.manual_seed(0)
    fields = {**TINY, 'max_position_embeddings': 16, 'vocab_size': 40, **CAUSAL_LMS[name]}
    mt.create_model(name, **fields).save_pretrained(str(tmp_path))
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    ours = mt.from_pretrained(str(tmp_path)).eval()
    prompt = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(theirs(prompt).logits, ours(prompt).logits)
        labels_loss = theirs(prompt, labels=prompt).loss
        assert torch.equal(labels_loss, ours(prompt, labels=prompt).loss)
    # greedy generation past the context (6 + 14 > 16 positions) crops the prefix to its last 16 tokens: the argmax
    # of our forward on that window, step by step
    expected = prompt
    with torch.no_grad():
        for _ in range(14):
            expected = torch.cat([expected, ours(expected[:, -16:]).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(theirs.generate(prompt, max_new_tokens=14, do_sample=False), expected)


def test_pipeline_takes_our_model_itself(tokenizer):
    ours = _create('bert', tokenizer).eval()
    fill = pipeline('fill-mask', model=ours, tokenizer=tokenizer)
    assert fill.model is ours
    expected = _fill_mask(ours, tokenizer, 'the film was [MASK] .', 3)[0]
    assert [p['token'] for p in fill('the film was [MASK] .', top_k=3)] == [i for i, _, _ in expected]


def test_label_names_are_saved_in_the_config(tokenizer, tmp_path, single_thread):
    ours = _create('bigs', tokenizer, task='sequence_classification', num_labels=3)
    ours.config.id2label = dict(enumerate(LABEL_NAMES))
    ours.config.label2id = {name: i for i, name in enumerate(LABEL_NAMES)}
    ours.save_pretrained(str(tmp_path / 'saved'), tokenizer=tokenizer)
    again = mt.from_pretrained(str(tmp_path / 'saved')).eval()
    batch = _batch(tokenizer, TEXTS)
    with torch.no_grad():
        assert torch.equal(again(**batch).logits, ours.eval()(**batch).logits)
    loaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / 'saved'))
    assert loaded.config.id2label == dict(enumerate(LABEL_NAMES))
    # transformers.Trainer reads a checkpoint back with load_state_dict(<model.safetensors>, strict=False)
    from safetensors.torch import load_file
    fresh = type(ours)(loaded.config)
    result = fresh.load_state_dict(load_file(str(tmp_path / 'saved' / 'model.safetensors')), strict=False)
    assert not result.unexpected_keys and not result.missing_keys
    with torch.no_grad():
        assert torch.equal(fresh.eval()(**batch).logits, again(**batch).logits)


def test_trainer_fine_tunes_the_auto_loaded_classifier(tokenizer, tmp_path, single_thread):
    """transformers.Trainer on the Auto-loaded model: gradient accumulation averages our mean losses (the model says
    it takes no num_items_in_batch), checkpoints are our folders, and the best one is read back into the model."""
    pytest.importorskip('accelerate', reason='transformers.Trainer needs accelerate')
    _create('gmlp', tokenizer, task='sequence_classification', num_labels=2, classifier_dropout=0.0
            ).save_pretrained(str(tmp_path / 'start'), tokenizer=tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / 'start'))
    texts = [f'{s} was {w} .' for s in SUBJECTS for w in ('good', 'great', 'bad', 'awful')][:16]
    batch = _batch(tokenizer, texts, token_types=False)
    labels = torch.tensor([int(t.split()[-2] in ('good', 'great')) for t in texts])
    rows = [{'input_ids': i, 'attention_mask': m, 'labels': y}
            for i, m, y in zip(batch['input_ids'], batch['attention_mask'], labels)]
    with torch.no_grad():
        loss_before = float(model(**batch, labels=labels).loss)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / 'out'), max_steps=2, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        learning_rate=1e-2, logging_steps=1, eval_strategy='steps', eval_steps=1, save_strategy='steps',
        save_steps=1, load_best_model_at_end=True, report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows)
    trainer.train()
    assert not trainer.model_accepts_loss_kwargs
    # the first update's logged loss is the mean over its two micro-batches of 8, i.e. over all 16 rows
    assert trainer.state.log_history[0]['loss'] == pytest.approx(loss_before, rel=1e-4)
    best = trainer.state.best_model_checkpoint
    again = mt.from_pretrained(best).eval()  # a checkpoint is our folder, and the model holds its weights
    with torch.no_grad():
        assert torch.equal(again(**batch).logits, model.eval()(**batch).logits)


BYTE_CHAR_TEXTS = ['hello <mask>orld', 'héllo  wörld 日本 ', '\n\ttab <mask>', 'world', '']


def _byte_or_char(which):
    from mlp_vision.text.tokenizer import DEFAULT_CONTROL_TOKENS
    if which == 'byte':
        return mt.byte_tokenizer()
    # 'char': no unknown token, so an unseen character is an error
    return mt.char_tokenizer(set('hello world\n\t'), DEFAULT_CONTROL_TOKENS,
                             unk='<unk>' if which == 'char-unk' else None)


def _ours_with_masks(ours, text):
    """Our ids of ``text`` with each '<mask>' string as the mask id (ours encode it as characters)."""
    pieces = text.split('<mask>')
    return [i for n, piece in enumerate(pieces)
            for i in ([ours.mask_token_id] if n else []) + ours.encode(piece, add_special_tokens=False)]


@pytest.mark.parametrize('which', ['byte', 'char-unk', 'char'])
def test_byte_and_char_tokenizers_have_the_same_ids_in_transformers(which, tmp_path):
    """Issue 36: a byte / char folder in a pipeline failed with 'You need to have sentencepiece or tiktoken
    installed'. Their transformers form gives our ids, token types and template (a '<mask>' string becomes the mask
    id, as in every transformers tokenizer); a character outside a char alphabet is the unknown token or an error,
    never dropped."""
    ours = _byte_or_char(which)
    ours.save_pretrained(str(tmp_path))
    assert mt.load_tokenizer(str(tmp_path)).backend_tokenizer.to_str() == ours.backend_tokenizer.to_str()  # reloads
    world = ours.encode('world', add_special_tokens=False)
    for theirs in (AutoTokenizer.from_pretrained(str(tmp_path)),):
        for text in BYTE_CHAR_TEXTS:
            if which == 'char' and set(text.replace('<mask>', '')) - set(ours.get_vocab()):
                with pytest.raises(Exception, match='Missing'):
                    theirs(text)
                continue
            got = theirs(text, 'world')
            first = [ours.cls_token_id] + _ours_with_masks(ours, text) + [ours.sep_token_id]
            assert got['input_ids'] == first + world + [ours.sep_token_id]
            assert got['token_type_ids'] == [0] * len(first) + [1] * (len(world) + 1)
            assert theirs.decode(got['input_ids'], skip_special_tokens=True) == \
                ours.decode(got['input_ids'], skip_special_tokens=True)


def test_pipeline_on_a_byte_tokenizer_folder(tmp_path, single_thread):
    tok = mt.byte_tokenizer()
    torch.manual_seed(0)
    model = mt.create_model('gmlp_base', **{**TINY, 'vocab_size': tok.vocab_size})
    model.save_pretrained(str(tmp_path), tokenizer=tok)
    ours = mt.from_pretrained(str(tmp_path))
    for text in ('hello <mask>orld', 'a <mask> and <mask>'):
        got = pipeline('fill-mask', model=str(tmp_path))(text, top_k=3)
        got = [got] if isinstance(got[0], dict) else got  # one list per mask
        assert [[(p['token'], p['score']) for p in row] for row in got] == \
            [[(i, p) for i, _, p in row] for row in _fill_mask(ours, ours.tokenizer, text, 3)]


def test_unsupported_requests_are_clear(tokenizer, tmp_path):
    with pytest.raises(UsageError, match='not a folder'):
        mt.GMLPForMaskedLM.from_pretrained(str(tmp_path / 'some-org/some-model'))
    ours = _create('gmlp', tokenizer)
    with pytest.raises(NotImplementedError, match='hidden states'):
        ours(torch.tensor([[1, 2, 3]]), output_hidden_states=True)
    with pytest.raises(NotImplementedError, match='push_to_hub'):
        ours.save_pretrained(str(tmp_path / 'x'), push_to_hub=True)
    assert isinstance(ours(torch.tensor([[1, 2, 3]]), return_dict=False), tuple)
    with pytest.raises(TypeError, match='attention_maks'):  # a misspelt keyword does not pass unseen
        ours(torch.tensor([[1, 2, 3]]), attention_maks=torch.ones(1, 3))
    folder = tmp_path / 'classifier'
    _create('gmlp', tokenizer, task='sequence_classification', num_labels=3).save_pretrained(str(folder))
    with pytest.raises(TypeError, match='bogus'):
        AutoModelForSequenceClassification.from_pretrained(str(folder), bogus=1)
