"""Dense, per-sample, float64 references for every metric of lightning_gae.metrics, written from the docstrings'
formulas with plain Python loops. Nothing here imports lightning_gae: the perturbation references remove units
themselves (tabular features replaced by their means) and run the model one perturbed sample at a time.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

# --- average precision ---------------------------------------------------------------------------


def average_precision_oracle(scores, labels):
    """Sum over the distinct thresholds, high to low, of the recall gained times the precision there."""
    positives, ap, recalled = sum(labels), 0.0, 0.0
    for threshold in sorted(set(scores), reverse=True):
        chosen = [label for score, label in zip(scores, labels) if score >= threshold]
        recall = sum(chosen) / positives
        ap += (recall - recalled) * sum(chosen) / len(chosen)
        recalled = recall
    return ap


def segmentation_ap_oracle(relevance, mask):
    """One sample, float64: min-max, then the background channel 1 - m and the foreground channel m ranked together."""
    m = relevance.double().flatten()
    m = ((m - m.min()) / (m.max() - m.min())).tolist()
    foreground = (mask.flatten() != 0).tolist()
    return average_precision_oracle([1 - v for v in m] + m, [not f for f in foreground] + foreground)


# --- agreement with ground truth ----------------------------------------------------------------------


def relevance_segmentation_oracle(maps, masks):
    """Each map min-max normalised and thresholded at its own mean; pixel counts over all samples; AP per sample."""
    tp = fp = fn = tn = 0
    aps = []
    for relevance, mask in zip(maps, masks):
        m = relevance.double().flatten().tolist()
        low, high = min(m), max(m)
        m = [(v - low) / (high - low) if high > low else 0.0 for v in m]
        mean = sum(m) / len(m)
        for value, truth in zip(m, (mask.flatten() != 0).tolist()):
            predicted = value > mean
            tp += predicted and truth
            fp += predicted and not truth
            fn += (not predicted) and truth
            tn += (not predicted) and not truth
        aps.append(segmentation_ap_oracle(relevance, mask))
    ious = [tn / (tn + fp + fn), tp / (tp + fp + fn)]
    return {"pixel_accuracy": (tp + tn) / (tp + fp + fn + tn), "miou": sum(ious) / 2, "mean_ap": sum(aps) / len(aps)}


def rationale_agreement_oracle(scores, rationales, valid=None, k=None):
    """Per sample with a rationale among its valid tokens: top-k F1 and the AP of the valid tokens' scores."""
    f1s, aps = [], []
    for b in range(scores.shape[0]):
        keep = [t for t in range(scores.shape[1]) if valid is None or bool(valid[b, t])]
        s = [float(scores[b, t]) for t in keep]
        r = [int(rationales[b, t] != 0) for t in keep]
        wanted = sum(r)
        if wanted == 0:
            continue
        top = min(k if k is not None else wanted, len(s))
        chosen = sorted(range(len(s)), key=lambda i: -s[i])[:top]
        f1s.append(2 * sum(r[i] for i in chosen) / (top + wanted))
        aps.append(average_precision_oracle(s, r))
    return {"token_f1": sum(f1s) / len(f1s), "auprc": sum(aps) / len(aps)}


def alignment_accuracy_oracle(relevance, alignment, valid=None, ignore_index=-1):
    """Per pair, in Python: a hit when the aligned source beats every other allowed source strictly."""
    if relevance.dim() == 2:
        relevance, alignment = relevance[:, None], alignment[:, None]
    hits = count = 0
    for b in range(relevance.shape[0]):
        for j in range(relevance.shape[1]):
            a = int(alignment[b, j])
            if a == ignore_index:
                continue
            count += 1
            allowed = [s for s in range(relevance.shape[2]) if valid is None or bool(valid[b, s])]
            if a in allowed and all(float(relevance[b, j, a]) > float(relevance[b, j, s]) for s in allowed if s != a):
                hits += 1
    return hits / count


def _ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = rank + 1
    return ranks


def explanation_stability_oracle(first, second, top_fraction=0.1):
    """Spearman's rho = 1 - 6 sum d^2 / (n (n^2 - 1)) over samples where neither is constant (no ties otherwise);
    top-k IoU and overlap with k = round(top_fraction * N), at least 1, over every sample."""
    rhos, ious, overlaps = [], [], []
    for a, b in zip(first.double().tolist(), second.double().tolist()):
        n = len(a)
        if max(a) > min(a) and max(b) > min(b):
            d2 = sum((x - y) ** 2 for x, y in zip(_ranks(a), _ranks(b)))
            rhos.append(1 - 6 * d2 / (n * (n * n - 1)))
        k = max(1, round(top_fraction * n))
        top_a = set(sorted(range(n), key=lambda i: -a[i])[:k])
        top_b = set(sorted(range(n), key=lambda i: -b[i])[:k])
        ious.append(len(top_a & top_b) / len(top_a | top_b))
        overlaps.append(len(top_a & top_b) / k)
    return {"spearman": sum(rhos) / len(rhos), "topk_iou": sum(ious) / len(ious), "topk_overlap": sum(overlaps) / len(overlaps)}


# --- perturbation protocols on tabular features ----------------------------------------------------------


def _count(fraction, n, at_least_one=False):
    """floor(f * n) with f the decimal fraction as written (0.3 is 3/10); ERASER's bins remove at least one unit."""
    k = math.floor(Fraction(str(fraction)) * n)
    return max(k, 1) if at_least_one and fraction > 0 and n > 0 else k


def _logits(model, features):
    with torch.no_grad():
        return model(torch.tensor([features], dtype=torch.float32))[0].double().tolist()


def _probability(logits, c):
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    return exps[c] / sum(exps)


def _argmax(logits):
    return max(range(len(logits)), key=lambda c: logits[c])


def _classes(clean, given, protocol):
    """(explained, reference): the class scored and the class a perturbed prediction must equal."""
    predicted = _argmax(clean)
    if protocol == "predicted":
        return predicted, predicted if given is None else given
    explained = predicted if given is None else given
    return explained, explained


def _ranking(scores, order):
    """Units most relevant first (``positive``) or least relevant first (``negative``); ties in index order."""
    return sorted(range(len(scores)), key=lambda u: (-scores[u] if order == "positive" else scores[u], u))


def _given(target, b):
    if target is None:
        return None
    return int(target) if isinstance(target, int) else int(target[b])


def _trapezoid(curve, fractions):
    return sum(0.5 * (curve[s] + curve[s + 1]) * (fractions[s + 1] - fractions[s]) for s in range(len(curve) - 1))


def curve_oracle(model, means, x, attributions, target, fractions, order="positive", score="probability",
                 protocol="target", insertion=False, scale=1.0):
    """The area under the mean score curve: at fraction f the top floor(f n) units (in ``order``) of each sample are
    replaced by their means (``insertion``: every unit is its mean except those top ones)."""
    curves = []
    for b in range(x.shape[0]):
        features, relevance = x[b].tolist(), attributions[b].tolist()
        explained, reference = _classes(_logits(model, features), _given(target, b), protocol)
        ranking = _ranking(relevance, order)
        curve = []
        for f in fractions:
            top = set(ranking[: _count(f, len(features))])
            if insertion:
                perturbed = [v if u in top else means[u] for u, v in enumerate(features)]
            else:
                perturbed = [means[u] if u in top else v for u, v in enumerate(features)]
            logits = _logits(model, perturbed)
            curve.append(float(_argmax(logits) == reference) if score == "accuracy" else _probability(logits, explained))
        curves.append(curve)
    mean = [sum(c[s] for c in curves) / len(curves) for s in range(len(fractions))]
    return scale * _trapezoid(mean, [float(f) for f in fractions])


def eraser_oracle(model, means, x, attributions, target, bins, protocol="target", keep_only=False, with_zero=False):
    """The mean over samples of the scored class's probability drop, averaged over ``bins`` (AOPC: and the 0 step)."""
    values = []
    for b in range(x.shape[0]):
        features, relevance = x[b].tolist(), attributions[b].tolist()
        clean = _logits(model, features)
        explained, _ = _classes(clean, _given(target, b), protocol)
        ranking = _ranking(relevance, "positive")
        drops = []
        for bin_ in bins:
            top = set(ranking[: _count(bin_, len(features), at_least_one=True)])
            if keep_only:
                perturbed = [v if u in top else means[u] for u, v in enumerate(features)]
            else:
                perturbed = [means[u] if u in top else v for u, v in enumerate(features)]
            drops.append(_probability(clean, explained) - _probability(_logits(model, perturbed), explained))
        values.append(sum(drops) / (len(bins) + 1) if with_zero else sum(drops) / len(bins))
    return sum(values) / len(values)


def rationale_recall_oracle(scores, rationales, valid=None, k=None):
    """rationale_recall one sample at a time in plain Python (lists, sorted()): the most relevant valid token in
    the rationale, one of the top k in it, and the rationale's share of the positive relevance."""
    valid = [[True] * len(row) for row in rationales.tolist()] if valid is None else valid.tolist()
    tops, hits, masses = [], [], []
    for s, r, v in zip(scores.tolist(), rationales.tolist(), valid):
        kept = [(value, bool(truth)) for value, truth, ok in zip(s, r, v) if ok]
        if not any(truth for _, truth in kept):
            continue
        ranked = sorted(kept, key=lambda item: -item[0])
        top = k if k is not None else sum(truth for _, truth in kept)
        tops.append(float(ranked[0][1]))
        hits.append(float(any(truth for _, truth in ranked[:top])))
        positive = sum(max(value, 0.0) for value, _ in kept)
        masses.append(sum(max(value, 0.0) for value, truth in kept if truth) / positive if positive > 0 else 0.0)
    n = len(tops)
    return {"top1": sum(tops) / n, "hit_at_k": sum(hits) / n, "mass": sum(masses) / n}


def region_share_oracle(scores, mask, valid=None):
    """Mean over samples of the positive relevance on the region over all positive relevance (valid tokens only);
    a sample without positive relevance is not counted. One sample and one token at a time."""
    shares = []
    for b in range(scores.shape[0]):
        total = on_region = 0.0
        for n in range(scores.shape[1]):
            if valid is not None and not bool(valid[b, n]):
                continue
            mass = max(float(scores[b, n]), 0.0)
            total += mass
            on_region += mass if bool(mask[b, n]) else 0.0
        if total > 0:
            shares.append(on_region / total)
    return torch.tensor(sum(shares) / len(shares))


def region_recall_oracle(scores, mask, valid=None, k=None):
    """Mean over samples with a non-empty region of |top-k valid tokens in the region| / min(k, |region|), k the
    region's size by default (no ties in the data it is given)."""
    recalls = []
    for b in range(scores.shape[0]):
        tokens = [n for n in range(scores.shape[1]) if valid is None or bool(valid[b, n])]
        region = [n for n in tokens if bool(mask[b, n])]
        if not region:
            continue
        top = min(len(region) if k is None else k, len(tokens))
        best = sorted(tokens, key=lambda n: float(scores[b, n]), reverse=True)[:top]
        recalls.append(sum(n in region for n in best) / min(top, len(region)))
    return torch.tensor(sum(recalls) / len(recalls))


# --- noisy linear imputation (ROAD) ----------------------------------------------------------------


def linear_imputation_oracle(image, mask):
    """One image ``[C, H, W]``, float64: the removed pixels' system written densely from the formula (each removed
    pixel the 1/6 (direct) and 1/12 (diagonal) weighted mean of its in-image neighbours) and solved directly."""
    channels, height, width = image.shape
    image = image.double()
    removed = [(i, j) for i in range(height) for j in range(width) if mask[i, j]]
    index = {pixel: n for n, pixel in enumerate(removed)}
    a = torch.zeros(len(removed), len(removed), dtype=torch.float64)
    b = torch.zeros(len(removed), channels, dtype=torch.float64)
    for n, (i, j) in enumerate(removed):
        for di in (-1, 0, 1):
            for dj in (-1, 0, 1):
                y, x = i + di, j + dj
                if (di, dj) == (0, 0) or not (0 <= y < height and 0 <= x < width):
                    continue
                weight = 1 / 12 if di and dj else 1 / 6
                a[n, n] += weight
                if (y, x) in index:
                    a[n, index[(y, x)]] -= weight
                else:
                    b[n] += weight * image[:, y, x]
    out = image.clone()
    if removed:
        solved = torch.linalg.solve(a, b)
        for n, (i, j) in enumerate(removed):
            out[:, i, j] = solved[n]
    return out
