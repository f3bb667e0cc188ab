""" The study's reference points on Rotten Tomatoes polarity (issue 13.4): the majority class and a bag-of-words
logistic regression (TF-IDF of word uni- and bigrams, scikit-learn), trained on train.tsv, scored on dev.tsv.

    python results/text/study/baselines.py --data ../shared/data/rt-polarity --out results/text/study/baselines.json
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


def read_tsv(path: Path):
    with open(path, newline='', encoding='utf-8') as f:
        rows = list(csv.DictReader(f, delimiter='\t', quoting=csv.QUOTE_NONE))
    return [r['sentence'] for r in rows], [int(r['label']) for r in rows]


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--data', default='../shared/data/rt-polarity')
    p.add_argument('--out', default='')
    args = p.parse_args()
    x_train, y_train = read_tsv(Path(args.data) / 'train.tsv')
    x_dev, y_dev = read_tsv(Path(args.data) / 'dev.tsv')
    t0 = time.perf_counter()
    majority = Counter(y_train).most_common(1)[0][0]
    pred_major = [majority] * len(y_dev)
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
    clf = LogisticRegression(C=4.0, max_iter=2000)
    clf.fit(vec.fit_transform(x_train), y_train)
    pred_bow = clf.predict(vec.transform(x_dev)).tolist()

    def scores(pred):
        return {'acc': round(100 * accuracy_score(y_dev, pred), 2), 'f1': round(100 * f1_score(y_dev, pred), 2),
                'mcc': round(100 * matthews_corrcoef(y_dev, pred), 2)}

    res = {'date': time.strftime('%Y-%m-%d'), 'train_examples': len(y_train), 'dev_examples': len(y_dev),
           'majority_class': {'label': majority, **scores(pred_major)},
           'tfidf_uni_bigram_logreg': {'C': 4.0, 'features': len(vec.vocabulary_), **scores(pred_bow)},
           'seconds': round(time.perf_counter() - t0, 1)}
    print(json.dumps(res, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + '\n')


if __name__ == '__main__':
    main()
