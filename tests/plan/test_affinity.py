"""Node-affine plans (dalistream.plan.affinity): each node reads a fixed, balanced set of shards
every epoch; every sample once (exact); equal steps; elastic resume onto another node count (or
onto no affinity, or from it) continues the epoch exactly. What each worker delivers is simulated
independently of the plan's arithmetic: its parts and drops become epoch positions through the
shard order, then run through the real shuffle buffer (or a column's steps), as in test_resume."""

import heapq
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dalistream.errors import ConfigError, StateError
from dalistream.plan import Layout, Schedule, epoch_layout, steps_per_epoch, worker_columns, worker_plan
from dalistream.plan import seeds
from dalistream.plan.affinity import (AffinePlan, Nodes, Regrouped, cache_kept, greedy_owner, node_owner, ranks_per_node,
                                      remaining_after, resolve_nodes)
from dalistream.tools.quality import (affine_rank_batches, affine_shuffle_quality, affine_summary, epoch_positions,
                                     rank_batches, shuffle_quality)
from dalistream.plan.shuffle import shuffled
from dalistream.plan.resume import continued, segment_head

from helpers import positions


def plans_of(plan, layout):
    """Every (plan, slot) of a segment's workers (columns when reading interleaved)."""
    for r, w in itertools.product(range(layout.world_size), range(layout.workers)):
        yield from ((wp, 1 if plan.columns else layout.slots[w]) for wp in plan.plans(r, w))


def run_segments(counts, schedule, epoch, segments_spec, shuffle):
    """``segments_spec``: (layout, nodes or None, columns, steps run or None for the rest). Returns
    the delivered epoch positions and the segments recorded."""
    segments, delivered = [], []
    for k, (layout, nodes, columns, steps_run) in enumerate(segments_spec):
        plan = AffinePlan(counts, layout, nodes, schedule, epoch, columns=columns, shuffle=0 if columns else shuffle,
                          segments=segments)
        last = k == len(segments_spec) - 1
        steps = plan.steps if last else min(steps_run, plan.steps)
        for wp, slot in plans_of(plan, layout):
            assert wp.steps == plan.steps  # equal steps on every rank
            seq = positions(wp, counts, layout, schedule, epoch)
            assert len(seq) == wp.samples <= plan.steps * slot or schedule.policy == "fixed"
            out = seq if columns else list(shuffled(seq, shuffle, wp.shuffle_seed))
            delivered += out[:steps * slot]
        if nodes is None:
            planned = layout.planned(columns)
            segments.append((planned.world_size, planned.workers, planned.batch_size, steps))
        else:
            segments.append((layout.world_size, layout.workers, layout.batch_size, steps, nodes.count, int(columns)))
    return delivered, segments


def shards_read(plan, layout):
    return {s for wp, _ in plans_of(plan, layout) for s, a, b in wp.parts if b > a}


def node_layouts(max_nodes=6, max_per_node=4):
    return st.tuples(st.integers(1, max_nodes), st.integers(1, max_per_node), st.integers(1, 3),
                     st.integers(1, 12)).map(lambda t: (Layout(t[0] * t[1], t[2], max(t[2], t[3])), Nodes(t[0], t[1])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 40), min_size=6, max_size=30), spec=node_layouts(),
       policy=st.sampled_from(["exact", "even"]), columns=st.booleans(), shuffle=st.sampled_from([0, 4]),
       seed=st.integers(0, 99))
def test_each_node_reads_its_own_balanced_shards_every_epoch(counts, spec, policy, columns, shuffle, seed):
    layout, nodes = spec
    if len(counts) < nodes.count or sum(counts) == 0:
        return
    schedule = Schedule(seed, policy)
    owner = node_owner(counts, nodes.count, seed)
    per_node = np.bincount(owner, weights=counts, minlength=nodes.count)
    assert per_node.max() - per_node.min() <= max(counts)  # balanced within one shard of count
    for epoch in range(3):
        plan = AffinePlan(counts, layout, nodes, schedule, epoch, columns=columns, shuffle=0 if columns else shuffle)
        for r in range(layout.world_size):
            node_plan = [wp for w in range(layout.workers)
                         for wp in plan.plans(r, w)]
            read = {s for wp in node_plan for s, a, b in wp.parts if b > a}
            assert {int(owner[s]) for s in read} <= {nodes.node_of(r)}  # the same shards, every epoch
        delivered, _ = run_segments(counts, schedule, epoch, [(layout, nodes, columns, None)], shuffle)
        total = sum(counts)
        assert len(delivered) == len(set(delivered))
        if policy == "exact":
            assert sorted(delivered) == list(range(total))
            assert shards_read(plan, layout) == {s for s, c in enumerate(counts) if c}
        else:
            per_step = nodes.ranks_per_node * layout.batch_size
            assert len(delivered) == plan.steps * layout.world_size * layout.batch_size
            assert total - len(delivered) < nodes.count * (per_step + max(counts))


def resume_specs():
    """2 to 4 segments, each with or without affinity, on its own node count."""
    seg = st.tuples(node_layouts(5, 3), st.booleans(), st.booleans(), st.integers(0, 12))
    return st.lists(seg, min_size=2, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 40), min_size=5, max_size=30), specs=resume_specs(),
       policy=st.sampled_from(["exact", "even"]), shuffle=st.sampled_from([0, 3, 16]), seed=st.integers(0, 99),
       epoch=st.integers(0, 3))
@pytest.mark.slow
def test_elastic_resume_onto_other_node_counts_delivers_the_epoch(counts, specs, policy, shuffle, seed, epoch):
    total = sum(counts)
    if total == 0 or any(affine and len(counts) < n.count for (_, n), affine, _, _ in specs):
        return
    columns = specs[0][2]  # a run reads one way: interleaved or not, in every segment
    chain = [(layout, nodes if affine else None, columns, steps) for (layout, nodes), affine, _, steps in specs]
    delivered, segments = run_segments(counts, Schedule(seed, policy), epoch, chain, shuffle)
    assert len(delivered) == len(set(delivered))  # no sample twice, in any policy
    if policy == "exact":
        assert sorted(delivered) == list(range(total))
    else:
        layout, nodes = specs[-1][0]
        slack = nodes.count * (nodes.ranks_per_node * layout.batch_size + max(counts)) if specs[-1][1] else \
            layout.world_size * layout.batch_size
        assert set(delivered) <= set(range(total)) and total - len(delivered) < slack


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(1, 300), min_size=128, max_size=300),
       nodes=st.lists(st.tuples(st.integers(1, 128), st.integers(1, 8)), min_size=2, max_size=3),
       fraction=st.floats(0, 1), policy=st.sampled_from(["exact", "even"]), columns=st.booleans())
def test_large_layouts(counts, nodes, fraction, policy, columns):
    """R up to 1,024 (nodes 1 to 128 of 1 to 8 ranks), with the node count changed mid-epoch."""
    schedule, total = Schedule(3, policy), sum(counts)
    chain = []
    for k, (n, per) in enumerate(nodes):
        layout, layout_nodes = Layout(n * per, 1, 2), Nodes(n, per)
        if policy == "even" and AffinePlan(counts, layout, layout_nodes, schedule, 0, columns=columns,
                                           segments=[]).steps == 0:
            return
        chain.append((layout, layout_nodes, columns, None))
    plan = AffinePlan(counts, chain[0][0], chain[0][1], schedule, 0, columns=columns)
    chain[0] = chain[0][:3] + (int(fraction * plan.steps),)
    chain[1:-1] = [c[:3] + (plan.steps // 3,) for c in chain[1:-1]]
    owner = node_owner(counts, chain[0][1].count, 3)
    sums = np.bincount(owner, weights=counts)
    assert sums.max() - sums.min() <= max(counts)
    delivered, _ = run_segments(counts, schedule, 0, chain, 0)
    assert len(delivered) == len(set(delivered))
    if policy == "exact":
        assert len(delivered) == total


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(1, 300), min_size=128, max_size=300), nodes=st.integers(1, 128),
       per_node=st.integers(1, 8), policy=st.sampled_from(["exact", "even"]), columns=st.booleans(),
       seed=st.integers(0, 99))
def test_large_layouts_keep_each_node_on_the_same_balanced_shards(counts, nodes, per_node, policy, columns, seed):
    """R up to 1,024 (nodes 1 to 128 of 1 to 8 ranks): in every epoch each rank reads only its
    node's shards, the same set (exact: all of them) in two epochs of different orders, the nodes'
    samples within one shard's count of each other."""
    layout, spec, schedule = Layout(nodes * per_node, 1, 2), Nodes(nodes, per_node), Schedule(seed, policy)
    owner = node_owner(counts, nodes, seed)
    sums = np.bincount(owner, weights=counts, minlength=nodes)
    assert sums.max() - sums.min() <= max(counts)
    read_by_epoch = []
    for epoch in range(2):
        plan = AffinePlan(counts, layout, spec, schedule, epoch, columns=columns)
        if plan.steps == 0:
            return
        read = [set() for _ in range(nodes)]
        for r in range(layout.world_size):
            for wp in plan.plans(r, 0):
                read[r // per_node] |= {s for s, a, b in wp.parts if b > a}
        for n in range(nodes):
            assert {int(owner[s]) for s in read[n]} <= {n}
            if policy == "exact":
                assert read[n] == set(np.flatnonzero(owner == n).tolist())
        read_by_epoch.append(read)
    if policy == "exact":
        assert read_by_epoch[0] == read_by_epoch[1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=20),
       layouts=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 10)), min_size=1, max_size=3),
       steps=st.lists(st.integers(0, 10), min_size=3, max_size=3), policy=st.sampled_from(["exact", "even"]),
       shuffle=st.sampled_from([0, 5]))
def test_without_nodes_and_segments_it_is_the_fresh_plan(counts, layouts, steps, policy, shuffle):
    """Without nodes the rest of an epoch is cut as the whole epoch is: before any segment ran,
    the same parts (less empty shards), drops, samples and steps as the fresh spans and columns."""
    schedule = Schedule(2, policy)
    for r, w, b in layouts:
        layout = Layout(r, w, max(w, b))
        ours = AffinePlan(counts, layout, None, schedule, 1, columns=False, shuffle=shuffle)
        assert ours.steps == steps_per_epoch(counts, layout, schedule, 1, 0)
        cols = AffinePlan(counts, layout, None, schedule, 1, columns=True)
        for r, w in itertools.product(range(layout.world_size), range(layout.workers)):
            pairs = [(ours.plans(r, w)[0], worker_plan(counts, len(counts), layout, schedule, 1, r, w))]
            pairs += zip(cols.plans(r, w), worker_columns(counts, len(counts), layout, schedule, 1, r, w))
            for a, b in pairs:
                assert (a.parts, a.drop, a.samples, a.steps) == (tuple(p for p in b.parts if p[2] > p[1]), b.drop,
                                                                 b.samples, b.steps)


def plain_plans(counts, layout, schedule, epoch, columns):
    """The plans a worker reads today without affinity (no resume): worker_plan / worker_columns."""
    for r, w in itertools.product(range(layout.world_size), range(layout.workers)):
        if columns:
            yield from worker_columns(counts, len(counts), layout, schedule, epoch, r, w)
        else:
            yield worker_plan(counts, len(counts), layout, schedule, epoch, r, w)


def same_plans(ours, theirs):
    for a, b in zip(ours, theirs, strict=True):
        assert (a.parts, a.drop, a.samples, a.steps, a.left_out) == (
            tuple(p for p in b.parts if p[2] > p[1]), b.drop, b.samples, b.steps, b.left_out)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=20), ranks=st.integers(1, 5),
       workers=st.integers(1, 3), batch=st.integers(1, 10), policy=st.sampled_from(["exact", "even"]),
       columns=st.booleans(), one_node=st.booleans(), seed=st.integers(0, 99), epoch=st.integers(0, 3))
def test_without_nodes_or_on_one_node_it_is_the_plain_plan(counts, ranks, workers, batch, policy, columns, one_node,
                                                            seed, epoch):
    """Parts, drops (even's left-out samples, spread and drawn per epoch), samples, steps and the
    left-out count of every worker (every column) are those of worker_plan / worker_columns."""
    layout, schedule = Layout(ranks, workers, max(workers, batch)), Schedule(seed, policy)
    plan = AffinePlan(counts, layout, Nodes(1, ranks) if one_node else None, schedule, epoch, columns=columns)
    same_plans([wp for wp, _ in plans_of(plan, layout)], plain_plans(counts, layout, schedule, epoch, columns))
    assert plan.left_out == (sum(counts) - plan.steps * ranks * layout.batch_size if policy == "even" else 0)


def rank_sizes(plan, layout):
    """Samples in every rank's batch at every step: ``(ranks, steps)`` (a worker's span of ``m``
    delivers ``min(slot, m − t·slot)`` at step ``t``, its shuffle buffer aside)."""
    sizes = np.zeros((layout.world_size, plan.steps), dtype=np.int64)
    t = np.arange(plan.steps)
    for r, w in itertools.product(range(layout.world_size), range(layout.workers)):
        for wp in plan.plans(r, w):
            slot = 1 if plan.columns else layout.slots[w]
            sizes[r] += np.clip(wp.samples - t * slot, 0, slot)
    return sizes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 60), min_size=4, max_size=24), spec=node_layouts(),
       columns=st.booleans(), seed=st.integers(0, 99), epoch=st.integers(0, 3))
def test_exact_deals_each_nodes_last_step_position_by_position(counts, spec, columns, seed, epoch):
    """Under exact a node's steps are full up to its own last, whose samples are dealt one to every
    rank's first position, then every rank's second...: at every step the batches of a node's ranks
    differ by at most one sample, earlier ranks first, and a rank's batches only shrink; so a rank
    of a node gets an empty batch only where its node has fewer samples left than ranks (or none)."""
    layout, nodes = spec
    if len(counts) < nodes.count:
        return
    plan = AffinePlan(counts, layout, nodes, Schedule(seed, "exact"), epoch, columns=columns)
    sizes = rank_sizes(plan, layout)
    per_node = plan.sequence.node_totals
    per_step = nodes.ranks_per_node * layout.batch_size
    for n in range(nodes.count):
        mine = sizes[n * nodes.ranks_per_node:(n + 1) * nodes.ranks_per_node]
        assert mine.sum() == per_node[n]
        assert (mine[:-1] >= mine[1:]).all() and (mine[0] - mine[-1] <= 1).all()  # dealt by position
        assert (mine[:, :-1] >= mine[:, 1:]).all()  # steps filled in order
        own = -(-int(per_node[n]) // per_step)  # the node's own steps: all full but its last
        assert (mine[:, :max(own - 1, 0)] == layout.batch_size).all() and (mine[:, own:] == 0).all()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 60), min_size=4, max_size=24), spec=node_layouts(),
       columns=st.booleans(), seed=st.integers(0, 99))
def test_even_leaves_out_samples_spread_over_each_node_and_drawn_per_epoch(counts, spec, columns, seed):
    """Node n leaves out T_n − steps·L·B samples: one in each of as many equal stretches of its own
    sequence (its shards in the epoch's order), not its tail, and passed over (drops) by the
    workers reading around them; drawn anew each epoch."""
    layout, nodes = spec
    if len(counts) < nodes.count:
        return
    schedule, owner, per_step = Schedule(seed, "even"), node_owner(counts, nodes.count, seed), \
        nodes.ranks_per_node * layout.batch_size
    left_by_epoch = []
    for epoch in range(3):
        plan = AffinePlan(counts, layout, nodes, schedule, epoch, columns=columns)
        delivered, _ = run_segments(counts, schedule, epoch, [(layout, nodes, columns, None)], 0 if columns else 4)
        ep = epoch_layout(counts, Layout(1, 1, 1), schedule, epoch)
        position_owner = np.repeat(owner[ep.order], np.asarray(counts)[ep.order])
        left = np.setdiff1d(np.arange(ep.total), delivered)
        assert plan.left_out == len(left)
        for n in range(nodes.count):
            sequence = np.flatnonzero(position_owner == n)  # node n's sequence, as epoch positions
            total, mine = len(sequence), np.flatnonzero(np.isin(sequence, left))  # indices in it
            assert len(mine) == total - plan.steps * per_step
            if len(mine):
                edges = (np.arange(len(mine) + 1) * total) // len(mine)
                assert (np.searchsorted(edges, mine, "right") - 1 == np.arange(len(mine))).all()
        left_by_epoch.append(frozenset(left.tolist()))
    if len(left_by_epoch[0]) >= 4 and sum(counts) >= 3 * len(left_by_epoch[0]):
        assert len(set(left_by_epoch)) > 1  # (not the same samples every epoch)


def test_the_segment_a_state_records():
    layout = Layout(4, 2, 6)
    assert continued((), segment_head(layout, layout.planned(True), 2, True), 3, ()) == (((4, 2, 6, 3, 2, 1),), 0)
    assert continued((), segment_head(layout, layout.planned(True), None, True), 3, ()) == (((24, 1, 1, 3),), 0)
    assert continued((), segment_head(layout, layout, None, False), 3, ()) == (((4, 2, 6, 3),), 0)


def test_epoch_positions_leave_out_drops_and_check_the_count():
    from dalistream.plan.resume import Stretch

    assert epoch_positions([Stretch(3, 7, (4, 6)), Stretch(10, 12)], 4).tolist() == [3, 5, 10, 11]
    with pytest.raises(ValueError):
        epoch_positions([Stretch(3, 7)], 3)


@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("policy", ["exact", "even"])
def test_one_node_is_the_plain_order(columns, policy):
    counts, layout, schedule = [30, 17, 25, 0, 41, 12, 9], Layout(3, 2, 6), Schedule(4, policy)
    ours = affine_rank_batches(counts, layout, Nodes(1, 3), schedule, 2, 8, columns)
    assert np.array_equal(ours, rank_batches(counts, layout, schedule, 2, 8, columns=columns))


def test_equal_steps_pad_or_leave_out_per_node():
    """Nodes of 100 and 60 samples, 2 ranks x batch 10 each: even runs 3 steps (60 // 20), leaving
    out 40 + 0; exact runs 5 (100 / 20), the smaller node padding 40 slots."""
    counts = [50, 50, 30, 30]
    nodes, layout = Nodes(2, 2), Layout(4, 1, 10)
    assert sorted(np.bincount(node_owner(counts, 2, 0), weights=counts)) == [80, 80]
    counts = [50, 50, 60]
    owner = node_owner(counts, 2, 0)
    assert sorted(np.bincount(owner, weights=counts)) == [60, 100]
    even = affine_summary(counts, layout, nodes, Schedule(0, "even"), 0, True)
    exact = affine_summary(counts, layout, nodes, Schedule(0, "exact"), 0, True)
    assert (even["steps"], even["left_out"]) == (3, 40) and (exact["steps"], exact["padding"]) == (5, 40)
    assert exact["samples_per_node"] == {"min": 60, "max": 100} and exact["shards_per_node"] == {"min": 1, "max": 2}


def test_owners_are_balanced_round_robin_for_equal_counts_and_stable():
    owner = node_owner([1251] * 1024, 128, 7)
    assert (np.bincount(owner) == 8).all()
    assert np.array_equal(owner, node_owner([1251] * 1024, 128, 7)) and not np.array_equal(owner, node_owner(
        [1251] * 1024, 128, 8))
    with pytest.raises(ConfigError, match="3 shards cannot give each of 4 nodes"):
        node_owner([5, 5, 5], 4, 0)


def test_cache_kept_after_a_node_count_change():
    counts = [100] * 64
    assert cache_kept(counts, 8, 8, 0) == [1.0] * 8
    # equal counts are dealt round robin over one seeded order: a node keeps its shards' share
    assert cache_kept(counts, 8, 16, 0) == [1.0] * 8 + [0.0] * 8  # nodes 8-15 start cold
    assert cache_kept(counts, 16, 8, 0) == [0.5] * 8
    kept = cache_kept(counts, 8, 12, 0)
    assert kept[8:] == [0.0] * 4 and 0 < min(kept[:8]) and max(kept[:8]) < 1


@pytest.mark.parametrize("env,rank,world,expected", [
    ({}, 0, 8, Nodes(1, 8)),
    ({"LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}, 5, 8, Nodes(2, 4)),
    ({"SLURM_NTASKS_PER_NODE": "2", "SLURM_NODEID": "3"}, 7, 8, Nodes(4, 2)),
    ({"SLURM_NTASKS_PER_NODE": "4(x2)"}, 0, 8, Nodes(2, 4)),
])
def test_nodes_come_from_the_launcher(env, rank, world, expected):
    assert resolve_nodes(rank, world, env) == expected


@pytest.mark.parametrize("env,rank,world,nodes,words", [
    ({"LOCAL_WORLD_SIZE": "3"}, 0, 8, None, "not whole nodes"),
    ({"LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0"}, 5, 8, None, "runs on node 0"),
    ({"SLURM_NTASKS_PER_NODE": "2", "SLURM_NODEID": "x"}, 0, 8, None, "SLURM_NODEID"),
    ({}, 0, 8, 3, "dividing"),
])
def test_a_node_layout_that_does_not_fit_is_named(env, rank, world, nodes, words):
    with pytest.raises(ConfigError, match=words):
        resolve_nodes(rank, world, env, nodes)


def test_explicit_nodes_and_ranks_per_node():
    assert resolve_nodes(3, 8, {"LOCAL_WORLD_SIZE": "8"}, nodes=4) == Nodes(4, 2)
    assert ranks_per_node({"LOCAL_WORLD_SIZE": "0"}) is None and ranks_per_node({}) is None


def test_a_segment_past_its_plan_is_a_state_error():
    with pytest.raises(StateError, match="ran 99 steps"):
        AffinePlan([10, 10, 10], Layout(2, 1, 2), Nodes(2, 1), Schedule(0, "exact"), 0, columns=False,
                   segments=[(2, 1, 2, 99, 2, 0)])


def test_affinity_costs_mixing_on_class_sorted_shards():
    """Data written in class order, 16 shards of one class each, 4 nodes: a rank's batches draw from
    its node's 4 classes, while a global batch still spans them all."""
    counts, layout = [64] * 16, Layout(4, 1, 16)
    plain = shuffle_quality(counts, layout, Schedule(0, "even"), 0, 0, classes=16, columns=True)
    ours = affine_shuffle_quality(counts, layout, Nodes(4, 1), Schedule(0, "even"), 0, 0, classes=16, columns=True)
    assert ours["order"]["rank_batch"]["distinct"] <= 4 < plain["order"]["rank_batch"]["distinct"]
    assert ours["order"]["global_batch"]["distinct"] >= 12 and ours["nodes"] == 4


def greedy_reference(counts, order, nodes):
    """The ownership rule shard by shard: each shard of ``order`` to the node first by (samples so
    far, shards so far, node number)."""
    heap = [(0, 0, n) for n in range(nodes)]
    owner = np.empty(len(counts), dtype=np.int64)
    for s in order:
        load, held, n = heapq.heappop(heap)
        owner[s] = n
        heapq.heappush(heap, (load + int(counts[s]), held + 1, n))
    return owner


def owner_counts():
    """Few distinct counts (many ties), a wide spread, or one large shard among small ones."""
    return st.one_of(st.lists(st.integers(0, 3), min_size=1, max_size=120),
                     st.lists(st.integers(0, 2000), min_size=1, max_size=120),
                     st.lists(st.integers(1, 5), min_size=1, max_size=60).map(lambda c: c + [500]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=owner_counts(), nodes=st.integers(1, 40), seed=st.integers(0, 2**31), shuffled_order=st.booleans())
def test_node_owner_is_the_greedy_rule_shard_by_shard(counts, nodes, seed, shuffled_order):
    """The batched computation gives the rule's own owners, for the order node_owner takes the
    shards in (largest first) and for any order (where a batch breaks off far more often)."""
    counts = np.asarray(counts, dtype=np.int64)
    nodes = min(nodes, len(counts))
    if shuffled_order:
        order = np.random.default_rng(seed).permutation(len(counts))
        assert np.array_equal(greedy_owner(counts, order, nodes), greedy_reference(counts, order, nodes))
    perm = np.random.default_rng(seeds.node_shards(seed)).permutation(len(counts))
    largest_first = perm[np.argsort(-counts[perm], kind="stable")]
    assert np.array_equal(node_owner(counts, nodes, seed), greedy_reference(counts, largest_first, nodes))


def test_greedy_owner_on_many_small_orders():
    """Ties on samples broken by shards held, then by node number, where a batch starts: 3,000
    small cases of counts 0-3 in random orders (about one in ten puts such a tie first in line)."""
    rng = np.random.default_rng(2)
    assert np.array_equal(greedy_owner(np.array([3, 1, 2, 1, 1, 0, 1, 2, 3]), np.array([4, 2, 5, 7, 3, 6, 0, 1, 8]), 2),
                          greedy_reference([3, 1, 2, 1, 1, 0, 1, 2, 3], [4, 2, 5, 7, 3, 6, 0, 1, 8], 2))
    for _ in range(3000):
        counts = rng.integers(0, 4, int(rng.integers(2, 14)))
        order, nodes = rng.permutation(len(counts)), int(rng.integers(1, len(counts) + 1))
        assert np.array_equal(greedy_owner(counts, order, nodes), greedy_reference(counts, order, nodes))


def test_node_owner_is_the_greedy_rule_at_scale():
    rng = np.random.default_rng(11)
    for counts, nodes in ((rng.integers(900, 1101, 20000), 512), (rng.integers(0, 3, 5000), 64),
                          (rng.pareto(1.5, 8000).astype(np.int64) * 100, 96)):
        perm = np.random.default_rng(seeds.node_shards(5)).permutation(len(counts))
        order = perm[np.argsort(-counts[perm], kind="stable")]
        assert np.array_equal(node_owner(counts, nodes, 5), greedy_reference(counts, order, nodes))


def expand(runs):
    return [p for run in runs for p in range(run.start, run.stop) if p not in set(run.drop)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(0, 40), min_size=6, max_size=30), specs=resume_specs(),
       policy=st.sampled_from(["exact", "even"]), shuffle=st.sampled_from([0, 3]), seed=st.integers(0, 99),
       to=st.integers(1, 5))
@example(counts=[0, 0, 1, 0, 0, 2], policy="exact", shuffle=3, seed=0, to=1,  # interleaved: the segments ran unshuffled
         specs=[((Layout(1, 1, 1), Nodes(1, 1)), False, True, 1), ((Layout(2, 1, 1), Nodes(2, 1)), True, False, 0),
                ((Layout(1, 1, 1), Nodes(1, 1)), False, False, 0)])
def test_regrouped_is_the_rest_grouped_node_by_node(counts, specs, policy, shuffle, seed, to):
    """A resumed epoch's rest (runs with drops) regrouped onto ``to`` nodes: each node's samples in
    the rest's order, node after node, against the rest laid out position by position."""
    if sum(counts) == 0 or len(counts) < to or any(affine and len(counts) < n.count
                                                  for (_, n), affine, _, _ in specs):
        return
    schedule, columns = Schedule(seed, policy), specs[0][2]
    chain = [(layout, nodes if affine else None, columns, steps) for (layout, nodes), affine, _, steps in specs]
    _, segments = run_segments(counts, schedule, 1, chain[:-1], shuffle)
    ep = epoch_layout(counts, Layout(1, 1, 1), schedule, 1)
    first = segments[0]
    rest = remaining_after(counts, ep, schedule, 1, segments, 0 if columns else shuffle, first)  # as run_segments ran
    owner = node_owner(counts, to, seed)
    grouped = Regrouped(rest, ep, owner, to)
    laid = np.asarray(expand(rest.runs(0, rest.total)), dtype=np.int64)
    node = owner[ep.order[np.searchsorted(ep.starts, laid, side="right") - 1]]
    want = laid[np.argsort(node, kind="stable")]
    assert np.array_equal(grouped.node_totals, np.bincount(node, minlength=to))
    assert expand(grouped.runs(0, grouped.total)) == want.tolist()
    rng = np.random.default_rng(seed)
    for lo, hi in [sorted(rng.integers(0, grouped.total + 1, 2).tolist()) for _ in range(4)]:
        assert expand(grouped.runs(lo, hi)) == want[lo:hi].tolist()
