""" Hugging Face interoperability (needs ``transformers``, a test-only dependency; skipped without it):
``transformers.Trainer`` fine-tunes our sequence classifiers, our outputs index like its ``ModelOutput``, and
``AutoTokenizer`` reads our saved subword tokenizers with the same ids. Data is made here.
"""
import pytest
import torch

import mlp_vision.text as mt

transformers = pytest.importorskip('transformers', reason='transformers is not installed (test-only dependency)')
pytest.importorskip('accelerate', reason='transformers.Trainer needs accelerate')

WORDS = ['good', 'great', 'fine', 'bad', 'awful', 'poor']


def sentiment_dataset(tokenizer, n=64, seed=0):
    """Sentences whose label is whether they hold more of the first three words than of the last three."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        label = int(torch.randint(2, (1,), generator=g))
        picks = torch.randint(3, (4,), generator=g) + (0 if label else 3)
        noise = torch.randint(6, (2,), generator=g)
        words = [WORDS[i] for i in picks.tolist() + noise.tolist()]
        order = torch.randperm(len(words), generator=g).tolist()
        enc = tokenizer(' '.join(words[i] for i in order), max_length=32, truncation=True, padding='max_length',
                        return_tensors='pt', return_token_type_ids=False)
        rows.append({'input_ids': enc['input_ids'][0], 'attention_mask': enc['attention_mask'][0],
                     'labels': torch.tensor(label)})
    return rows


@pytest.mark.parametrize('name', ['gmlp_base', 'bigs_small'])
def test_transformers_trainer_fine_tunes_our_classifier(name, tmp_path, single_thread):
    torch.manual_seed(0)
    tok = mt.ByteTokenizer()
    small = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                 max_position_embeddings=32, classifier_dropout=0.0)
    if name == 'bigs_small':
        small.update(pad_token_id=tok.pad_id, num_ssm_states=8, hidden_dropout_prob=0.0)
    model = mt.create_model(name, task='sequence_classification', num_labels=2, **small)
    data = sentiment_dataset(tok)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=40, per_device_train_batch_size=16, learning_rate=5e-3,
        warmup_steps=0, weight_decay=0.0, logging_steps=1, save_strategy='no', report_to=[], use_cpu=True,
        seed=0, disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [e['loss'] for e in trainer.state.log_history if 'loss' in e]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 0.6 and last < 0.5 * first, (first, last)  # from ~ln 2 to well below it
    # the trained model still is ours: predictions through our forward
    preds = trainer.predict(data[:16])
    assert preds.predictions.shape == (16, 2)
    batch = torch.stack([r['input_ids'] for r in data[:16]])
    mask = torch.stack([r['attention_mask'] for r in data[:16]])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(preds.predictions), model(batch, attention_mask=mask).logits,
                                   rtol=1e-4, atol=1e-5)


def test_output_indexes_like_transformers_model_output():
    from transformers.modeling_outputs import MaskedLMOutput
    logits, loss = torch.randn(2, 3, 5), torch.tensor(1.5)
    for kwargs in ({'logits': logits}, {'loss': loss, 'logits': logits}):
        ours, theirs = mt.TextModelOutput(**kwargs), MaskedLMOutput(**kwargs)
        assert list(ours.keys()) == list(theirs.keys())
        assert ours[0] is theirs[0] and ours.to_tuple() == theirs.to_tuple()
        assert ('loss' in ours) == ('loss' in theirs)


def test_auto_tokenizer_reads_our_saved_subword_tokenizer(tmp_path):
    corpus = ['the movie was good and the actors were great .', 'a bad film , boring and slow .'] * 30
    tok = mt.train_tokenizer(texts=corpus, kind='wordpiece', vocab_size=80)
    tok.save_pretrained(str(tmp_path))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for a, b in (('the movie was good .', None), ('a boring film', 'the actors were great')):
        ours = tok(a, b)
        theirs = hf(a, b)
        assert ours['input_ids'] == theirs['input_ids']
        assert ours['token_type_ids'] == theirs['token_type_ids']
    assert (hf.pad_token_id, hf.mask_token_id, hf.cls_token_id) == (tok.pad_id, tok.mask_id, tok.cls_id)
