""" The study's reference points on Rotten Tomatoes polarity (issue 13.4): the majority class and a bag-of-words
logistic regression (TF-IDF of word uni- and bigrams, scikit-learn).

The same protocol as the neural runs (see README.md): fitted on ``fit.tsv``, the regularisation C chosen on
``heldout.tsv`` (both from ``prepare.py``: a 90 / 10 split of ``train.tsv``), reported on ``dev.tsv``, which nothing
was chosen on. The same model refitted on all of ``train.tsv`` with that C is reported too.

    python scripts/text_study/baselines.py --split RUNS/data --dev ../shared/data/rt-polarity/dev.tsv \
        --out results/text/study/baselines.json
"""
import argparse
import csv
import json
import time
from collections import Counter
from pathlib import Path

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

C_GRID = (0.25, 0.5, 1., 2., 4., 8., 16., 32.)


def read_tsv(path: Path):
    with open(path, newline='', encoding='utf-8') as f:
        rows = list(csv.DictReader(f, delimiter='\t', quoting=csv.QUOTE_NONE))
    return [r['sentence'] for r in rows], [int(r['label']) for r in rows]


def scores(y, pred):
    return {'acc': round(100 * accuracy_score(y, pred), 2), 'f1': round(100 * f1_score(y, pred), 2),
            'mcc': round(100 * matthews_corrcoef(y, pred), 2)}


def bag_of_words(x_train, y_train, c):
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
    clf = LogisticRegression(C=c, max_iter=5000)
    clf.fit(vec.fit_transform(x_train), y_train)
    return lambda x: clf.predict(vec.transform(x)).tolist(), len(vec.vocabulary_)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--split', required=True, help='prepare.py\'s output folder (fit.tsv, heldout.tsv)')
    p.add_argument('--dev', default='../shared/data/rt-polarity/dev.tsv')
    p.add_argument('--out', default='')
    args = p.parse_args()
    x_fit, y_fit = read_tsv(Path(args.split) / 'fit.tsv')
    x_held, y_held = read_tsv(Path(args.split) / 'heldout.tsv')
    x_dev, y_dev = read_tsv(Path(args.dev))
    t0 = time.perf_counter()
    majority = Counter(y_fit).most_common(1)[0][0]
    heldout_acc = {}
    for c in C_GRID:
        predict, _ = bag_of_words(x_fit, y_fit, c)
        heldout_acc[c] = round(100 * accuracy_score(y_held, predict(x_held)), 2)
    best_c = max(C_GRID, key=lambda c: (heldout_acc[c], -c))  # ties: the stronger regularisation
    predict, n_features = bag_of_words(x_fit, y_fit, best_c)
    predict_all, n_features_all = bag_of_words(x_fit + x_held, y_fit + y_held, best_c)
    res = {'date': time.strftime('%Y-%m-%d'), 'fit_examples': len(y_fit), 'heldout_examples': len(y_held),
           'dev_examples': len(y_dev),
           'majority_class': {'label': majority, **scores(y_dev, [majority] * len(y_dev))},
           'tfidf_uni_bigram_logreg': {'C': best_c, 'heldout_acc_per_C': heldout_acc, 'features': n_features,
                                       **scores(y_dev, predict(x_dev))},
           'tfidf_uni_bigram_logreg_all_train': {'C': best_c, 'features': n_features_all,
                                                 **scores(y_dev, predict_all(x_dev))},
           'seconds': round(time.perf_counter() - t0, 1)}
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + '\n')


if __name__ == '__main__':
    main()
