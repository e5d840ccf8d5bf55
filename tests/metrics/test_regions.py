"""lightning_gae.metrics region metrics: share and recall against plain loops, one sample at a time; the classes
alone, under MetricCollection and through the jackknife; the removal check on models whose evidence is known."""

import itertools
import math

import pytest
import torch
from torchmetrics import MetricCollection

from lightning_gae import ImageTokens, TabularTokens, TextTokens
from lightning_gae.metrics import RegionRecall, RegionShare
from lightning_gae.metrics.regions import RemovalCheck, beyond_chance, chance_shares, excess_over_chance, removal_check
from lightning_gae.metrics.stderr import per_sample_states, value_and_stderr
from lightning_gae.metrics.functional import region_recall, region_removal_drop, region_share

NAN = float("nan")


# --- plain references ---------------------------------------------------------------------------------


def share_loop(row, region, valid):
    """One sample: positive mass on the region over all positive mass; NaN for no mass or a non-finite value."""
    total = on = 0.0
    for value, inside, counts in zip(row, region, valid):
        if not counts:
            continue
        if not math.isfinite(value):
            return NAN
        mass = max(value, 0.0)
        total += mass
        on += mass if inside else 0.0
    return on / total if total > 0 else NAN


def recall_loop(row, region, valid, k):
    """One sample, by brute force: every order of the valid tokens by decreasing relevance (ties in every order
    they can take), the region's tokens among the first k, over min(k, |R|); the mean over those orders."""
    tokens = [n for n in range(len(row)) if valid[n]]
    size = sum(1 for n in tokens if region[n])
    if size == 0:
        return NAN
    if any(not math.isfinite(row[n]) for n in tokens):
        return NAN
    top = min(size if k is None else k, len(tokens))
    recalls = []
    for order in itertools.permutations(tokens):
        if all(row[a] >= row[b] for a, b in zip(order, order[1:])):
            recalls.append(sum(1 for n in order[:top] if region[n]) / min(top, size))
    return sum(recalls) / len(recalls)


def same(actual, expected):
    """Element-wise equal to 1e-6, NaN where expected is NaN."""
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert (math.isnan(a) and math.isnan(e)) or a == pytest.approx(e, abs=1e-6), (actual, expected)


# Rows chosen to hit every rule: ties at the k-th value, negative values, a row without positive mass, NaN and
# inf, an empty region, a region that is all tokens; B == N = 6 so that a transposed mask would still fit.
RELEVANCE = torch.tensor([
    [0.5, 0.2, 0.2, 0.2, -0.3, 0.1],      # a three-way tie at the 2nd value
    [-1.0, -0.5, -0.2, -0.1, -2.0, -0.7],  # no positive mass: share undefined, recall still ranks
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],        # flat: GAE's vanished relevance
    [0.3, NAN, 0.1, 0.2, 0.0, 0.4],        # non-finite
    [0.9, 0.1, 0.1, 0.4, 0.4, 0.1],        # empty region (below)
    [0.2, 0.2, float("inf"), 0.1, 0.3, 0.2],
])
REGION = torch.tensor([
    [False, True, False, True, False, False],
    [False, True, True, False, False, False],
    [True, False, False, False, False, False],
    [True, False, False, False, False, True],
    [False, False, False, False, False, False],
    [True, True, True, True, True, True],
])


def rows(t):
    return [[float(v) for v in r] for r in t.tolist()]


@pytest.mark.parametrize("with_valid", [False, True])
def test_region_share_is_the_plain_loop(with_valid):
    valid = torch.ones_like(REGION)
    if with_valid:
        valid[:, 5] = False                   # e.g. padding
        valid[5, 2] = False                   # the inf leaves the sixth sample
    expected = [share_loop(r, m, v) for r, m, v in zip(rows(RELEVANCE), REGION.tolist(), valid.tolist())]
    same(region_share(RELEVANCE, REGION, valid if with_valid else None).tolist(), expected)
    # The hand values of the first row: 0.2 + 0.2 on the region of 0.5 + 0.2 * 3 + 0.1 positive mass.
    assert region_share(RELEVANCE, REGION)[0].item() == pytest.approx(0.4 / 1.2)
    assert math.isnan(region_share(RELEVANCE, REGION)[1]) and math.isnan(region_share(RELEVANCE, REGION)[3])
    assert region_share(RELEVANCE, REGION)[4].item() == 0.0          # an empty region holds no mass


@pytest.mark.parametrize("k", [None, 1, 2, 3, 10])
@pytest.mark.parametrize("with_valid", [False, True])
def test_region_recall_is_the_plain_loop(k, with_valid):
    valid = torch.ones_like(REGION)
    if with_valid:
        valid[:, 4] = False
        valid[5, 2] = False
    expected = [recall_loop(r, m, v, k) for r, m, v in zip(rows(RELEVANCE), REGION.tolist(), valid.tolist())]
    same(region_recall(RELEVANCE, REGION, k, valid if with_valid else None).tolist(), expected)


def test_ties_are_shared_not_broken_by_index():
    # Three tokens tied at the 2nd value, one of them on the region: it gets a third of the second slot.
    assert region_recall(RELEVANCE[:1], REGION[:1], k=2).item() == pytest.approx((0 + 2 / 3) / 2)
    # A flat row scores the region's chance of being drawn: k / N for a one-token region, wherever it is.
    flat = torch.zeros(2, 4)
    region = torch.tensor([[True, False, False, False], [False, False, False, True]])
    assert region_recall(flat, region, k=2).tolist() == pytest.approx([0.5, 0.5])


def test_random_relevance_sits_at_the_floor():
    # The floor the callback logs beside every method: |R| / N of the mass, on average.
    generator = torch.Generator().manual_seed(0)
    relevance = torch.rand(4000, 20, generator=generator)
    region = torch.zeros(4000, 20, dtype=torch.bool)
    region[:, :5] = True
    assert region_share(relevance, region).mean().item() == pytest.approx(0.25, abs=0.01)
    assert region_recall(relevance, region).mean().item() == pytest.approx(0.25, abs=0.01)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="region_mask"):
        region_share(torch.zeros(2, 3), torch.zeros(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"relevance must be token relevance \[B, N\]"):
        region_share(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="k must be >= 1"):
        region_recall(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), k=0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        RegionRecall(k=0)


# --- the classes ---------------------------------------------------------------------------------------


FINITE = [0, 1, 2, 4]          # the rows without NaN or inf


def test_classes_are_the_mean_of_the_loop_over_counted_samples():
    share, recall = RegionShare(), RegionRecall(k=2)
    for batch in (FINITE[:2], FINITE[2:]):
        share.update(RELEVANCE[batch], REGION[batch])
        recall.update(RELEVANCE[batch], REGION[batch])
    shares = [share_loop(r, m, [True] * 6) for r, m in zip(rows(RELEVANCE[FINITE]), REGION[FINITE].tolist())]
    recalls = [recall_loop(r, m, [True] * 6, 2) for r, m in zip(rows(RELEVANCE[FINITE]), REGION[FINITE].tolist())]
    counted_shares = [s for s in shares if not math.isnan(s)]          # rows 0 and 4: rows 1, 2 have no mass
    counted_recalls = [r for r in recalls if not math.isnan(r)]        # rows 0, 1, 2: row 4's region is empty
    assert len(counted_shares) == 2 and len(counted_recalls) == 3
    assert share.compute().item() == pytest.approx(sum(counted_shares) / 2)
    assert recall.compute().item() == pytest.approx(sum(counted_recalls) / 3)


def test_a_non_finite_relevance_makes_the_class_nan_not_a_silent_zero():
    share, recall = RegionShare(), RegionRecall()
    share.update(RELEVANCE, REGION)
    recall.update(RELEVANCE, REGION)
    assert math.isnan(share.compute()) and math.isnan(recall.compute())
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(RegionShare().compute())                    # nothing counted yet


def test_classes_under_metric_collection_keep_their_own_values():
    # Compute groups merge metrics whose states share names and values: recalls at several k must not be merged.
    collection = MetricCollection({"share": RegionShare(), "recall": RegionRecall(), "recall_1": RegionRecall(k=1),
                                   "recall_3": RegionRecall(k=3)}, compute_groups=True)
    alone = {"share": RegionShare(), "recall": RegionRecall(), "recall_1": RegionRecall(k=1), "recall_3": RegionRecall(k=3)}
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        relevance = torch.rand(8, 10, generator=generator)
        region = torch.rand(8, 10, generator=generator) < 0.3
        collection.update(relevance, region)
        for metric in alone.values():
            metric.update(relevance, region)
    result = collection.compute()
    assert {k: round(v.item(), 6) for k, v in result.items()} == {k: round(m.compute().item(), 6) for k, m in alone.items()}
    assert len({result["recall"].item(), result["recall_1"].item(), result["recall_3"].item()}) == 3


def test_the_jackknife_of_the_sum_states_is_the_standard_error_of_the_mean():
    # The callback's standard errors come from per-sample states (metrics/_stderr.py); for a mean over
    # samples the jackknife is the sample standard deviation over sqrt(n).
    generator = torch.Generator().manual_seed(2)
    relevance = torch.rand(12, 7, generator=generator)
    region = torch.rand(12, 7, generator=generator) < 0.4
    region[:, 0] = True
    metric = RegionShare()
    states = per_sample_states(metric, lambda i: metric.update(relevance[i : i + 1], region[i : i + 1]), 12)
    value, error = value_and_stderr(metric, states)
    shares = region_share(relevance, region).double()
    assert value[""] == pytest.approx(shares.mean().item(), abs=1e-6)
    assert error[""] == pytest.approx((shares.std() / math.sqrt(12)).item(), rel=1e-4)


# --- the removal check -----------------------------------------------------------------------------------


class CornerModel(torch.nn.Module):
    """Class 1's logit is 8 x (mean of the top-left 2x2 patch - 0.5): only that patch decides."""

    def forward(self, x):
        corner = x[:, 0, :2, :2].mean(dim=(1, 2))
        return torch.stack([torch.zeros_like(corner), 8 * (corner - 0.5)], dim=1)


def images(batch=5, generator=None):
    x = torch.rand(batch, 1, 4, 4, generator=generator) * 0.2
    x[:, :, :2, :2] = 1.0
    return x


def token_mask(batch, patch, prefix=1, patches=4):
    mask = torch.zeros(batch, prefix + patches, dtype=torch.bool)
    mask[:, prefix + patch] = True
    return mask


@pytest.mark.parametrize("removal", ["pixel", "patch"])
def test_removal_separates_the_used_patch_from_an_unused_one(removal):
    modality = ImageTokens(patch_size=2, removal=removal)
    x = images(generator=torch.Generator().manual_seed(0))
    used = region_removal_drop(CornerModel(), x, token_mask(5, 0), modality, target=1, num_random=16,
                               generator=torch.Generator().manual_seed(0))
    unused = region_removal_drop(CornerModel(), x, token_mask(5, 3), modality, target=1, num_random=16,
                                 generator=torch.Generator().manual_seed(0))
    full = torch.sigmoid(torch.tensor(4.0)) - torch.sigmoid(torch.tensor(-4.0))   # the corner from 1.0 to black
    assert used.region.tolist() == pytest.approx([full.item()] * 5, abs=1e-6)
    assert unused.region.tolist() == pytest.approx([0.0] * 5, abs=1e-6)
    # A random one-patch region is the corner a quarter of the time, anything else costs nothing.
    assert used.random.shape == (5, 16)
    hit = (used.random - full).abs() < 1e-5
    assert (hit | (used.random.abs() < 1e-6)).all() and 0 < hit.float().mean() < 0.6
    assert (used.excess > 0.3).all() and (unused.excess <= 0).all() and (unused.excess < 0).any()


def test_random_regions_have_the_regions_size_and_only_removable_tokens():
    # Class 1's logit counts the tokens that are not [MASK]: every region of the same size costs the same.
    mask_id, pad_id, cls_id = 3, 0, 1
    modality = TextTokens(special_ids=(pad_id, cls_id, mask_id), pad_id=pad_id, mask_id=mask_id)

    def counting(input_ids, attention_mask=None):
        kept = ((input_ids != mask_id) & (input_ids != pad_id)).float().sum(dim=1)
        return torch.stack([torch.full_like(kept, 3.0), 0.5 * kept], dim=1)

    ids = torch.tensor([[cls_id, 5, 6, 7, 8, 9, pad_id], [cls_id, 5, 5, 6, pad_id, pad_id, pad_id]])
    inputs = {"input_ids": ids, "attention_mask": (ids != pad_id).long()}
    region = torch.tensor([[True, True, True, False, False, False, True],    # CLS and a pad: not removable
                           [False, False, True, True, False, False, False]])
    out = region_removal_drop(counting, inputs, region, modality, target=1, num_random=20,
                              generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(out.random, out.region[:, None].expand(2, 20))
    assert (out.region > 0).all()
    # An empty region has nothing to compare: NaN, not a drop of 0.
    empty = region_removal_drop(counting, inputs, torch.zeros_like(region), modality, target=1, num_random=2)
    assert torch.isnan(empty.region).all() and torch.isnan(empty.random).all()


def test_removal_on_tabular_features_and_text_tokens_finds_the_used_one():
    modality = TabularTokens(["a", "b", "c", "d"], prefix_tokens=1, means=[0.0] * 4)
    model = lambda x: torch.stack([torch.zeros(len(x)), 3 * x[:, 2]], dim=1)   # noqa: E731  only "c" counts
    x = torch.ones(6, 4)
    used, unused = (torch.zeros(6, 5, dtype=torch.bool) for _ in range(2))
    used[:, 1 + 2] = True
    unused[:, 1 + 0] = True
    seeded = dict(num_random=8, generator=torch.Generator().manual_seed(0))
    assert (region_removal_drop(model, x, used, modality, 1, **seeded).excess > 0).all()
    assert (region_removal_drop(model, x, unused, modality, 1, **seeded).excess <= 0).all()
    with pytest.raises(ValueError, match="does not fit"):
        region_removal_drop(model, x, used[:, 1:], modality, 1)
    with pytest.raises(ValueError, match="num_random"):
        region_removal_drop(model, x, used, modality, 1, num_random=0)


def test_the_removal_check_tells_the_used_feature_from_the_unused_one():
    modality = TabularTokens(["a", "b", "c", "d"], prefix_tokens=1, means=[0.0] * 4)
    model = lambda x: torch.stack([torch.zeros(len(x)), 3 * x[:, 2]], dim=1)   # noqa: E731  only "c" counts
    x = torch.rand(6, 4, generator=torch.Generator().manual_seed(0)) + 0.5
    used, unused = (torch.zeros(6, 5, dtype=torch.bool) for _ in range(2))
    used[:, 1 + 2] = True
    unused[:, 1 + 0] = True
    check = removal_check(model, x, used, modality, seed=0)
    assert check.uses and check.held == 6 and check.region > check.random > 0
    # The means over the samples are region_removal_drop's, drawn with the same seed.
    drop = region_removal_drop(model, x, used, modality, generator=torch.Generator().manual_seed(0))
    assert check.region == pytest.approx(drop.region.mean().item())
    assert check.region_stderr == pytest.approx(drop.region.std().item() / math.sqrt(6))
    assert check.random == pytest.approx(drop.random.mean(dim=1).mean().item())
    unused_check = removal_check(model, x, unused, modality, seed=0)
    assert not unused_check.uses and unused_check.region == 0.0
    # One sample holding the region cannot tell; none holding it says so.
    one = torch.zeros_like(used)
    one[0, 1 + 2] = True
    assert math.isnan(removal_check(model, x, one, modality, seed=0).region)
    assert removal_check(model, x, one, modality, seed=0).held == 1
    assert removal_check(model, x, torch.zeros_like(used), modality, seed=0).held == 0


# --- chance as the yardstick --------------------------------------------------------------------------


def test_chance_is_the_expected_share_of_uniform_random_relevance_per_sample():
    # Region size and padding both count: 1 of 4 tokens, 2 of 3 real tokens, none held.
    region = torch.tensor([[False, True, False, False], [False, True, True, False], [False] * 4])
    valid = torch.tensor([[True] * 4, [True, True, True, False], [True] * 4])
    same(chance_shares(region, valid).tolist(), [0.25, 2 / 3, NAN])
    # The random method's share averages to it over many draws (by symmetry, exactly in expectation).
    draws = torch.rand(20000, 4, generator=torch.Generator().manual_seed(0))
    mean = region_share(draws, region[1:2].expand(20000, 4), valid[1:2].expand(20000, 4)).mean().item()
    assert mean == pytest.approx(2 / 3, abs=0.005)


def test_an_alert_needs_the_excess_over_chance_beyond_its_standard_error_and_the_margin():
    chance = torch.full((8,), 1 / 64)
    corner = excess_over_chance(torch.tensor([0.25, 0.27, 0.23, 0.24, 0.26, 0.25, 0.22, 0.28]), chance)
    assert corner.samples == 8 and corner.excess == pytest.approx(0.25 - 1 / 64, abs=1e-6) and corner.stderr > 0
    assert beyond_chance(corner, suspect=True, margin=0.05)
    assert not beyond_chance(corner, suspect=False, margin=0.05)               # an evidence region: too much is fine
    assert not beyond_chance(corner, suspect=True, margin=0.3)                 # beyond the errors, not the margin
    # A region that covers every token a region can hold: share and chance are both 1.
    everything = excess_over_chance(torch.ones(8), torch.ones(8))
    assert everything.excess == 0.0 and not beyond_chance(everything, suspect=True, margin=0.0)
    # Noise: a mean excess within two standard errors does not alert, however small the margin.
    noisy = excess_over_chance(torch.tensor([0.6, 0.0, 0.5, 0.0, 0.02]), torch.full((5,), 0.1))
    assert noisy.excess > 0 and not beyond_chance(noisy, suspect=True, margin=0.0)
    # Too little relevance on an evidence region, and too few samples to tell.
    scarce = excess_over_chance(torch.tensor([0.01, 0.02, 0.0, 0.01]), torch.full((4,), 0.4))
    assert beyond_chance(scarce, suspect=False, margin=0.05)
    assert not beyond_chance(excess_over_chance(torch.tensor([0.9, 0.95]), torch.full((2,), 0.1)), True, 0.05)


def test_the_removal_check_on_two_samples_and_on_a_negligible_change_tells_nothing():
    modality = TabularTokens(["a", "b", "c", "d"], prefix_tokens=1, means=[0.0] * 4)
    model = lambda x: torch.stack([torch.zeros(len(x)), 3 * x[:, 2]], dim=1)   # noqa: E731  only "c" counts
    x = torch.rand(2, 4, generator=torch.Generator().manual_seed(0)) + 0.5
    used = torch.zeros(2, 5, dtype=torch.bool)
    used[:, 1 + 2] = True
    check = removal_check(model, x, used, modality, seed=0)
    # The one cue the model has, on two samples: a large drop, but not a verdict either way.
    assert check.measured == 2 and check.region > 0.1 and not check.uses and not check.tells
    # A 0.08% change, however sure, is no use of the region.
    tiny = RemovalCheck.from_drops(torch.full((64,), 0.0008) + torch.linspace(0, 1e-5, 64), torch.zeros(64), 64)
    assert tiny.tells and tiny.low > 0 and not tiny.uses
    wide = RemovalCheck.from_drops(torch.tensor([0.9, -0.5, 0.8, -0.6, 0.1]), torch.zeros(5), 5)
    assert wide.low < 0 < wide.high and not wide.tells and not wide.uses


def test_every_registered_method_has_region_shares_in_zero_one():
    # Signed methods (AttnLRP, Grad-CAM, Captum's gradients) count their positive part only: a share, whatever the sign.
    from lightning_gae.attribution import attribute
    from lightning_gae.methods.registry import method_names
    from lightning_gae.modalities.regions import token_relevance
    from tests.helpers.hf_modules import tiny_vit

    torch.manual_seed(0)
    model = tiny_vit().eval()        # a Hugging Face ViT: 16 patches of 4 x 4 pixels after the CLS token
    x = torch.randn(6, 3, 16, 16)
    modality = ImageTokens(patch_size=4, prefix_tokens=1)
    region = torch.zeros(6, 17, dtype=torch.bool)
    region[:, 1:5] = True
    region[3:, 5:12] = True
    signed = []
    for method in method_names():
        tokens = token_relevance(modality, attribute(method, model, x), x, 17)
        assert tokens is not None, method
        signed += [method] if bool((tokens < 0).any()) else []
        shares = region_share(tokens, region)
        finite = shares[torch.isfinite(shares)]
        assert len(finite) > 0 and bool(((finite >= 0) & (finite <= 1)).all()), (method, shares)
        metric = RegionShare()
        metric.update(tokens, region)
        assert 0.0 <= metric.compute().item() <= 1.0, method
    assert {"attnlrp", "saliency"} & set(signed)   # the signed methods were among them
