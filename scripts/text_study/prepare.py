"""Data splits of the study (issue 13.4, rounds 2 and 3), written under OUT (nothing here is committed data).

* Pretraining text: all of the WikiText-2 we have (``valid.txt`` + ``test.txt``; ``train.txt`` is not in
  ``../shared/data``), split **by article** (a line `` = Title = `` starts one): the last ``--val-articles`` articles
  of ``test.txt`` are the held-out text for the MLM curves, everything else is training text. Splitting by article
  keeps one article's sentences out of both sides.
* Fine-tuning: ``rt-polarity/train.tsv`` split into ``fit.tsv`` and ``heldout.tsv`` (a seeded, label-stratified
  ``--heldout-fraction``). Learning rates and checkpoints are chosen on ``heldout.tsv``; ``dev.tsv`` is read once per
  arm, for the reported number.
* The one vocabulary of every run: a WordPiece vocabulary of ``--vocab-size`` (BERT's normalizer, lower-cased)
  trained on the pretraining text only, saved in ``OUT/tokenizer`` (runs take it with ``--tokenizer-from``, since
  WordPiece training is not reproducible run to run).
* Round 3 also pretrains on the task's own unlabelled text (task-adaptive pretraining, Gururangan et al., arXiv
  2004.10964 §4): ``pretrain_text.txt`` is the WikiText-2 training text followed by the sentences of ``fit.tsv``,
  one per line, without their labels (``heldout.tsv`` and ``dev.tsv`` stay unseen). The vocabulary is still trained
  on WikiText-2 only.
* Round 4 (``--vocab-text pretrain --task-repeats 3``): the vocabulary is trained on the whole pretraining text, so the
  reviews' own words (``unwatchable``, ``heartfelt``) are whole tokens rather than WikiText pieces, and the ``fit.tsv``
  sentences appear three times in ``pretrain_text.txt`` (each copy shuffled anew), so about half of the pretraining
  text is the task's domain -- task-adaptive pretraining runs many epochs over the task text (arXiv 2004.10964 §4).

    python scripts/text_study/prepare.py --data ../shared/data --out RUNS/data
"""
import argparse
import csv
import os
import random
import re

ARTICLE = re.compile(r'^ = [^=].* = $')  # a level-1 heading; sections are ' = = ... = = '


def articles(path):
    """The file's articles, each a list of lines (text before the first heading joins the first article)."""
    out = []
    with open(path, encoding='utf-8') as f:
        for line in f:
            if ARTICLE.match(line.rstrip('\n')) or not out:
                out.append([])
            out[-1].append(line)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--data', required=True, help='the shared data folder (wikitext-2/, rt-polarity/)')
    ap.add_argument('--out', required=True)
    ap.add_argument('--val-articles', type=int, default=8)
    ap.add_argument('--heldout-fraction', type=float, default=0.1)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--vocab-size', type=int, default=8000)
    ap.add_argument('--vocab-text', choices=('wikitext', 'pretrain'), default='wikitext',
                    help="text the WordPiece vocabulary is trained on: WikiText-2's training text (rounds 2-3) or "
                         "the whole pretraining text, fit.tsv sentences included (round 4)")
    ap.add_argument('--task-repeats', type=int, default=1,
                    help='copies of the fit.tsv sentences in pretrain_text.txt (each copy in a new order)')
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    valid = articles(os.path.join(args.data, 'wikitext-2', 'valid.txt'))
    test = articles(os.path.join(args.data, 'wikitext-2', 'test.txt'))
    train_text = valid + test[:-args.val_articles]
    val_text = test[-args.val_articles:]
    for name, arts in (('wikitext_train.txt', train_text), ('wikitext_val.txt', val_text)):
        with open(os.path.join(args.out, name), 'x', encoding='utf-8') as f:
            f.writelines(line for art in arts for line in art)
        words = sum(len(line.split()) for art in arts for line in art)
        print(f'{name}: {len(arts)} articles, {words:,} words')

    with open(os.path.join(args.data, 'rt-polarity', 'train.tsv'), encoding='utf-8', newline='') as f:
        rows = list(csv.reader(f, delimiter='\t', quoting=csv.QUOTE_NONE))
    header, rows = rows[0], rows[1:]
    label_col = header.index('label')
    rng = random.Random(args.seed)
    fit, heldout = [], []
    for label in sorted({r[label_col] for r in rows}):
        group = [r for r in rows if r[label_col] == label]
        rng.shuffle(group)
        k = round(len(group) * args.heldout_fraction)
        heldout += group[:k]
        fit += group[k:]
    for name, part in (('fit.tsv', fit), ('heldout.tsv', heldout)):
        rng.shuffle(part)
        with open(os.path.join(args.out, name), 'x', encoding='utf-8', newline='') as f:
            w = csv.writer(f, delimiter='\t', quoting=csv.QUOTE_NONE, escapechar=None, lineterminator='\n')
            w.writerow(header)
            w.writerows(part)
        print(f'{name}: {len(part)} rows')

    text_col = header.index('sentence')
    pretrain_lines = [line for art in train_text for line in art]
    task_lines = [r[text_col].strip() + '\n' for r in fit]
    for copy in range(args.task_repeats):
        if copy:  # a new order each time, so no two 128-token blocks of the copies hold the same run of sentences
            task_lines = task_lines[:]
            rng.shuffle(task_lines)
        pretrain_lines += task_lines
    with open(os.path.join(args.out, 'pretrain_text.txt'), 'x', encoding='utf-8') as f:
        f.writelines(pretrain_lines)
    words = sum(len(r[text_col].split()) for r in fit)
    print(f'pretrain_text.txt: wikitext_train.txt + {args.task_repeats} x {len(fit)} fit.tsv sentences '
          f'({words:,} words each time), no labels')

    from mlp_vision.text import train_tokenizer
    vocab_lines = pretrain_lines if args.vocab_text == 'pretrain' else [line for art in train_text for line in art]
    tokenizer = train_tokenizer(texts=vocab_lines, kind='wordpiece', vocab_size=args.vocab_size)
    tokenizer.save_pretrained(os.path.join(args.out, 'tokenizer'))
    print(f'tokenizer: WordPiece, {tokenizer.vocab_size} tokens, trained on the {args.vocab_text} text')


if __name__ == '__main__':
    main()
