"""Property tests of mixing weighted sources over the pure plan (plan.mix): every batch holds the
stated count of each source and sums to B; every prefix is within one sample per source per rank
of the weights; the spans of one source never share a sample within a pass; every rank runs the
same steps; with samples_per_epoch a source runs through whole passes across epochs; R up to
1,024. And every bad input is a ConfigError that names the source."""

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from dalistream.errors import ConfigError
from dalistream.mixing import check_weights, parse_mix, parse_mix_arg
from dalistream.plan import (Layout, epoch_order, seeds, MixEpoch, Schedule, batch_sources, check_share, cumulative,
                             integer_weights, mix_steps, worker_take)
from dalistream.tools.planview import mix_summary

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def weight_lists():
    simple = st.lists(st.integers(1, 12), min_size=2, max_size=4).map(lambda w: [float(x) for x in w])
    odd = st.lists(st.floats(0.05, 1.0), min_size=2, max_size=4)
    return st.one_of(simple, odd)


def too_small(weights, batch_size):
    w = integer_weights(weights)
    return any(2 * x * batch_size < sum(w) for x in w)


def samples_of(ep, s):
    """(pass, shard, first, stop) of every part of source s, over all global workers."""
    out = []
    for g in range(ep.layout.global_workers):
        parts, passes = ep.spans_parts(s, [g])[0]
        assert sum(b - a for _, a, b in parts) == ep.bounds[s, g + 1] - ep.bounds[s, g]
        out += [(p, shard, a, b) for (shard, a, b), p in zip(parts, passes) if b > a]
    return out


def assert_disjoint(parts, counts):
    """No sample of a shard in two parts of the same pass; every part within its shard."""
    assert all(0 <= a < b <= counts[shard] for _, shard, a, b in parts)
    ordered = sorted(parts)
    for (p, s, _, b), (q, t, c, _) in zip(ordered, ordered[1:]):
        assert (p, s) != (q, t) or b <= c, "a sample twice within a pass"


# -- composition ------------------------------------------------------------------------------

def test_worked_example():
    counts = batch_sources([0.7, 0.3], 256, 10)
    assert counts.tolist() == [[179, 77], [179, 77], [180, 76], [179, 77], [179, 77]] * 2
    assert integer_weights([0.7, 0.3]) == (7, 3) and integer_weights([2, 2, 2]) == (1, 1, 1)


@FAST
@given(weights=weight_lists(), batch_size=st.integers(1, 512), steps=st.integers(0, 300),
       first=st.integers(0, 10**6), per_batch=st.sampled_from(["sample", "source"]))
def test_batches_sum_to_b_and_prefixes_stay_within_one(weights, batch_size, steps, first, per_batch):
    counts = batch_sources(weights, batch_size, steps, per_batch, dealt=first * (batch_size if per_batch == "sample" else 1))
    assert counts.shape == (steps, len(weights)) and (counts >= 0).all()
    assert (counts.sum(axis=1) == batch_size).all()
    if per_batch == "source":
        assert ((counts == 0) | (counts == batch_size)).all()
    w = np.asarray(integer_weights(weights))
    d = int(w.sum())
    assert abs(float(w[0]) / d - weights[0] / sum(weights)) < 2e-5
    unit = batch_size if per_batch == "sample" else 1
    t = np.arange(first, first + steps + 1)
    dealt = cumulative(weights, t * unit)  # every prefix of steps, from the start of the schedule
    assert (np.diff(dealt, axis=0) * (batch_size // unit) == counts).all()
    assert (np.abs(dealt * d - np.outer(t * unit, w)) < d).all()


@FAST
@given(weights=weight_lists(), n=st.integers(0, 5000))
def test_every_slot_prefix_within_one(weights, n):
    w = np.asarray(integer_weights(weights))
    dealt = cumulative(weights, np.arange(n + 1))
    assert (np.diff(dealt, axis=0).sum(axis=1) == 1).all()  # one slot to one source
    assert (np.abs(dealt * w.sum() - np.outer(np.arange(n + 1), w)) < w.sum()).all()


def test_largest_deficit_would_break_the_bound_tijdeman_does_not():
    # weights on which the plain smooth round robin is 1.26 samples off; the rule stays < 1 - 1/10
    weights = [821, 1, 45, 1, 955, 1]
    w = np.asarray(integer_weights(weights))
    dealt = cumulative(weights, np.arange(int(w.sum()) + 1))
    assert np.abs(dealt * w.sum() - np.outer(np.arange(int(w.sum()) + 1), w)).max() <= (1 - 1 / 10) * w.sum()


@FAST
@given(steps=st.integers(1, 40), workers=st.integers(1, 8), batch_size=st.integers(8, 300), weights=weight_lists())
def test_worker_take_fills_each_slot(steps, workers, batch_size, weights):
    layout = Layout(1, workers, batch_size)
    counts = batch_sources(weights, batch_size, steps)
    take = worker_take(counts, layout)
    assert take.shape == (steps, workers, len(weights))
    assert (take.sum(axis=2) == np.asarray(layout.slots)).all()
    assert (take.sum(axis=1) == counts).all()


# -- the epoch's spans ------------------------------------------------------------------------

@st.composite
def mixes(draw, ranks=(1, 2, 3, 8), tiny=True):
    R = draw(st.sampled_from(ranks))
    W = draw(st.integers(1, 4))
    B = draw(st.integers(W, 64))
    weights = draw(weight_lists())
    counts = [draw(st.lists(st.integers(0, 300), min_size=1, max_size=12)) for _ in weights]
    if tiny and draw(st.booleans()):  # a source of less than a batch per rank
        counts[draw(st.integers(0, len(weights) - 1))] = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    return Layout(R, W, B), weights, counts, Schedule(draw(st.integers(0, 5))), draw(st.integers(0, 4))


def check_epoch(ep, layout, weights):
    """The invariants of one planned epoch, over every global worker."""
    R, B, S = layout.world_size, layout.batch_size, len(weights)
    steps = ep.steps
    assert ep.batch_counts.shape == (steps, S) and (ep.batch_counts.sum(axis=1) == B).all()
    w = np.asarray(integer_weights(weights))
    epoch_share = ep.batch_counts.sum(axis=0)  # per rank
    if not ep.endless:  # within one sample per source per rank (per_batch="source": one batch)
        unit = B if ep.per_batch == "source" else 1
        assert (np.abs(epoch_share * w.sum() - w * steps * B) < w.sum() * unit).all()
    for r in range(R):
        for k in range(layout.workers):
            columns = ep.worker_columns(r, k)  # spans: one column of each source, in order
            assert [s for _, _, s in columns] == list(range(S))
            assert all(p.steps == steps and p.slot == layout.slots[k] for p, _, _ in columns)
            takes = np.stack([take for _, take, _ in columns], axis=1) if steps else np.zeros((0, S))
            assert (takes.sum(axis=1) == layout.slots[k]).all()
            for p, take, _ in columns:
                assert p.samples == int(take.sum()) == sum(b - a for _, a, b in p.parts)
    for s in range(S):
        seen = samples_of(ep, s)
        assert sum(b - a for *_, a, b in seen) == R * int(epoch_share[s])
        assert_disjoint(seen, ep.counts[s])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mixes(), per_batch=st.sampled_from(["sample", "sample", "source"]))
def test_spans_cover_each_sample_once_per_pass(case, per_batch):
    layout, weights, counts, schedule, epoch = case
    totals = [sum(c) for c in counts]
    names = [f"src{i}" for i in range(len(weights))]
    try:
        ep = MixEpoch(counts, weights, layout, schedule, epoch, names, per_batch)
    except ConfigError as e:
        event("refused")
        assert any(f"'{n}'" in str(e) for n in names)
        assert (0 in totals or (per_batch == "sample" and too_small(weights, layout.batch_size))
                or "fewer than its share of one step" in str(e) or "batches per epoch" in str(e))
        return
    check_epoch(ep, layout, weights)
    per_rank = ep.batch_counts.sum(axis=0)
    assert all(layout.world_size * u <= t for u, t in zip(per_rank, totals))
    more = batch_sources(weights, layout.batch_size, ep.steps + 1, per_batch)[-1]  # one more would repeat
    assert any(layout.world_size * (u + m) > t for u, m, t in zip(per_rank, more, totals))
    for r in range(layout.world_size):  # every rank computes the same steps from counts alone
        ((plan, _, _), *_) = MixEpoch(counts, weights, layout, schedule, epoch, names, per_batch).worker_columns(
            r, layout.workers - 1)
        assert plan.steps == ep.steps


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mixes(ranks=(1024,)))
@example(case=(Layout(1024, 4, 512), [0.7, 0.2, 0.1], [[300] * 1500, [250] * 1000, [100] * 1200], Schedule(3), 1))
@example(case=(Layout(1024, 3, 100), [1.0, 3.0], [[97] * 900, [1] * 50], Schedule(0), 0))
def test_1024_ranks(case):
    layout, weights, counts, schedule, epoch = case
    try:
        spe = layout.world_size * layout.batch_size * 3
        ep = MixEpoch(counts, weights, layout, schedule, epoch, samples_per_epoch=spe)
    except ConfigError:
        assert too_small(weights, layout.batch_size) or 0 in [sum(c) for c in counts]
        return
    assert ep.steps == 3
    check_epoch(ep, layout, weights)


@pytest.mark.slow
def test_default_epoch_of_1024_ranks_is_fast():
    layout = Layout(1024, 4, 512)
    counts = [[1000] * 20_000, [700] * 9000]
    ep = MixEpoch(counts, [0.6, 0.4], layout, Schedule(1), 2)
    assert ep.steps == min(20_000_000 // (1024 * 308), 6_300_000 // (1024 * 205))
    check_epoch(ep, layout, [0.6, 0.4])


# -- samples_per_epoch: passes across epochs --------------------------------------------------

@FAST
@given(case=mixes(), per_batch=st.sampled_from(["sample", "source"]), epochs=st.integers(2, 5),
       steps=st.integers(1, 12))
def test_endless_passes_never_repeat_before_all_seen(case, per_batch, epochs, steps):
    layout, weights, counts, schedule, _ = case
    spe = steps * layout.world_size * layout.batch_size + layout.batch_size // 2
    names = [f"src{i}" for i in range(len(weights))]
    try:
        plans = [MixEpoch(counts, weights, layout, schedule, e, names, per_batch, spe) for e in range(epochs)]
    except ConfigError as e:
        event("refused")
        assert any(f"'{n}'" in str(e) for n in names)
        return
    assert {p.steps for p in plans} == {steps}
    for ep in plans:
        check_epoch(ep, layout, weights)
    w = np.asarray(integer_weights(weights))
    unit = layout.batch_size if per_batch == "sample" else 1
    dealt = np.concatenate([p.batch_counts for p in plans]).sum(axis=0)  # the rule runs on across epochs
    assert (np.abs(dealt * w.sum() // (layout.batch_size // unit) - w * epochs * steps * unit) < w.sum()).all()
    for s, total in enumerate(sum(c) for c in counts):
        for a, b in zip(plans, plans[1:]):
            assert a.bounds[s, -1] == b.bounds[s, 0]  # epochs follow each other in the source's sequence
        seen = [x for ep in plans for x in samples_of(ep, s)]
        assert_disjoint(seen, counts[s])
        per_pass = Counter()
        for p, _, a, b in seen:
            per_pass[p] += b - a
        assert all(per_pass[p] == total for p in per_pass if p < max(per_pass))  # a pass is whole before the next


def one_span_parts(ep, source, g, bounds):
    """Span ``g``'s parts and passes cut pass by pass on their own (how they were worked out
    before columns were cut together): the reference of :meth:`MixEpoch.spans_parts`."""
    from dataclasses import replace

    lo, hi = int(bounds[g]), int(bounds[g + 1])
    total, parts, passes = ep.totals[source], [], []
    for p in range(lo // total, (hi - 1) // total + 1) if hi > lo else ():
        n_pass = ep.first_pass(source) + p
        cut = replace(ep.pass_layout(source, n_pass), bounds=np.clip(bounds - p * total, 0, total)).parts_of([g])[0]
        parts += cut
        passes += [n_pass] * len(cut)
    return parts, passes


@FAST
@given(case=mixes(), epochs=st.integers(1, 3), order=st.randoms(use_true_random=False))
def test_columns_cut_together_are_each_column_cut_alone(case, epochs, order):
    """Every column's parts and passes, worked out for many columns at once (in any order, with
    repeats, over passes crossed by some spans and not others: ``samples_per_epoch``), are those
    of the column worked out alone."""
    layout, weights, counts, schedule, _ = case
    spe = 3 * layout.world_size * layout.batch_size + layout.batch_size // 2
    try:
        eps = [MixEpoch(counts, weights, layout, schedule, e, samples_per_epoch=spe) for e in range(epochs)]
    except ConfigError:
        return
    for ep in eps:
        for s in range(len(weights)):
            for bounds in (ep.bounds[s], ep.columns[s]):
                spans = list(range(len(bounds) - 1)) * 2
                order.shuffle(spans)
                got = ep.spans_parts(s, spans, bounds)
                assert got == [one_span_parts(ep, s, g, bounds) for g in spans]


def test_endless_span_crosses_a_pass():
    layout = Layout(2, 2, 8)
    counts, weights = [[5, 7, 3], [50] * 8], [0.5, 0.5]
    ep = MixEpoch(counts, weights, layout, Schedule(4), 1, ["small", "big"], samples_per_epoch=80)
    crossing = [passes for _, passes in ep.spans_parts(0, range(layout.global_workers))]
    assert any(len(set(passes)) > 1 for passes in crossing)
    for passes in crossing:
        assert passes == sorted(passes)  # parts of pass p, then of pass p+1
    summary = mix_summary(counts, weights, layout, Schedule(4), 1, ["small", "big"], samples_per_epoch=80)
    small = summary["sources"][0]
    assert summary["steps"] == 5 and small["used"] == 40 and small["repeats"] == 40 and small["left_out"] == 0


def test_worked_example_of_the_module_doc():
    counts, layout = [[10_000] * 100, [10_000] * 30], Layout(8, 4, 256)
    ep = MixEpoch(counts, [0.7, 0.3], layout, Schedule(), 0, ["web", "books"])
    assert ep.steps == 488 and ep.take[0].tolist() == [[64, 0], [64, 0], [51, 13], [0, 64]]
    web, books = mix_summary(counts, [0.7, 0.3], layout, Schedule(), 1, ["web", "books"],
                             samples_per_epoch=1_000_000)["sources"]
    assert (web["used"], web["repeats"], web["passes"]) == (699_592, 399_192, [0, 1])
    assert books["repeats"] == 299_832 - 176


def test_summary_default_epoch():
    summary = mix_summary([[100] * 50, [30] * 20], [0.7, 0.3], Layout(2, 3, 10), Schedule(1), 0, ["a", "b"])
    a, b = summary["sources"]
    assert summary["steps"] == 100
    assert (a["used"], a["left_out"]) == (1400, 3600) and (b["used"], b["left_out"]) == (600, 0)
    assert a["per_batch"] == {"min": 7, "max": 7} and a["repeats"] == 0 and a["passes"] == [0, 0]


def test_deterministic_from_seed_and_epoch():
    counts = [[10 + i for i in range(40)], [7] * 30]
    layout = Layout(3, 2, 12)

    def parts(seed, epoch):
        ep = MixEpoch(counts, [0.4, 0.6], layout, Schedule(seed), epoch, samples_per_epoch=400)
        return [p.parts for r in range(3) for k in range(2) for p, _, _ in ep.worker_columns(r, k)]

    assert parts(1, 2) == parts(1, 2)
    assert parts(1, 2) != parts(2, 2) and parts(1, 2) != parts(1, 3)


def test_each_source_has_its_own_order_and_shuffle():
    counts = [[5] * 40, [5] * 40]
    ep = MixEpoch(counts, [1, 1], Layout(2, 2, 8), Schedule(7), 3)
    assert (ep.pass_layout(0, 3).order == epoch_order(40, 7, 3)).all()  # source 0: the unmixed epoch's order
    assert (ep.pass_layout(1, 3).order != ep.pass_layout(0, 3).order).any()
    (a, _, _), (b, _, _) = ep.worker_columns(1, 1)
    assert a.shuffle_seed == seeds.sample_shuffle(7, 3, 3) != b.shuffle_seed


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("weight, words", [(0, "greater than 0"), (-1.5, "greater than 0"), (math.nan, "finite"),
                                           (math.inf, "finite"), ("0.5", "a number"), (True, "a number"),
                                           (None, "a number")])
def test_bad_weight_names_the_source(weight, words):
    with pytest.raises(ConfigError, match=f"source 'web'.*{words}"):
        parse_mix({"books": ("b-{0..3}.tar", 1), "web": ("w-{0..3}.tar", weight)})
    with pytest.raises(ConfigError, match=f"source 'web'.*{words}"):
        check_weights({"web": weight})


def test_parse_mix_forms():
    books = {"source": ["b.tar"], "weight": 3, "manifest": "m.json", "storage_options": {"anon": True}}
    mix = parse_mix({"web": ("s3://a/w-{0..9}.tar", 7), "books": books})
    assert [(m.name, m.weight) for m in mix] == [("web", 0.7), ("books", 0.3)]
    assert mix[1].manifest == "m.json" and mix[1].storage_options == {"anon": True}
    assert parse_mix({"only": {"source": "x.tar"}})[0].weight == 1.0
    assert check_weights({"a": 1, "b": 3}) == {"a": 0.25, "b": 0.75}


@pytest.mark.parametrize("mapping, words", [
    ({"web": {"source": "w.tar", "wieght": 1}}, "source 'web': unknown key 'wieght'"),
    ({"web": {"weight": 1}}, "source 'web': missing source"),
    ({"web": ("", 1)}, "source 'web': missing source"),
    ({"web": ("w.tar",)}, "source 'web': expected"),
    ({"web": {"source": "w.tar", "storage_options": "anon"}}, "source 'web': storage_options"),
    ({"": ("w.tar", 1)}, "non-empty string"),
    ({}, "non-empty mapping"),
])
def test_parse_mix_errors(mapping, words):
    with pytest.raises(ConfigError, match=words):
        parse_mix(mapping)


def test_parse_mix_arg():
    assert parse_mix_arg("web=0.7:s3://a/web-{0000..0009}.tar") == ("web", 0.7, "s3://a/web-{0000..0009}.tar")
    assert parse_mix_arg("b=2:/data/b-*.tar") == ("b", 2.0, "/data/b-*.tar")
    for text, words in [("web:0.7", "NAME=WEIGHT:SOURCE"), ("web=0.7", "NAME=WEIGHT:SOURCE"),
                        ("=1:x.tar", "name ''"), ("web=abc:x.tar", "source 'web': weight must be a number"),
                        ("web=0:x.tar", "source 'web': weight must be greater than 0"),
                        ("web=nan:x.tar", "source 'web': weight must be finite"), ("web=1: ", "source 'web': missing")]:
        with pytest.raises(ConfigError, match=words):
            parse_mix_arg(text)


def test_share_and_empty_errors():
    with pytest.raises(ConfigError, match="source 'tiny': weight 0.001 .* rounds to 0"):
        check_share([0.999, 0.001], [100, 100], 256, names=["big", "tiny"])
    check_share([0.998, 0.002], [100, 100], 256, names=["big", "tiny"])  # half a sample per batch: kept
    with pytest.raises(ConfigError, match="source 'tiny'.*batches per epoch of 10 steps"):
        check_share([0.96, 0.04], [100, 100], 256, "source", steps=10, names=["big", "tiny"])
    with pytest.raises(ConfigError, match="source 'void' is empty"):
        MixEpoch([[10, 20], [0, 0]], [1, 1], Layout(1, 1, 4), Schedule(), 0, ["full", "void"])
    with pytest.raises(ConfigError, match="source 'few' has 3 samples, fewer than its share of one step on 2 ranks"):
        mix_steps([1000, 3], [0.5, 0.5], Layout(2, 1, 8), names=["many", "few"])
    with pytest.raises(ConfigError, match="per_batch"):
        batch_sources([1, 1], 8, 3, per_batch="shard")
    with pytest.raises(ConfigError, match="samples_per_epoch"):
        mix_steps([10, 10], [1, 1], Layout(1, 1, 8), samples_per_epoch=4)
