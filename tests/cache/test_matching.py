"""One test per matching rule of the prefix cache (see the cache issue and cache/DESIGN.md)."""

from __future__ import annotations

import torch

from cache import MediaKind, Namespace, NormalKV, PrefixCache, RecurrentSnapshot, RotatingKV
from tests.cache.helpers import audio, image, normal, recurrent, rotating, stateless, video

NS = Namespace("model-a", "float32")


def make(**kw) -> PrefixCache:
    return PrefixCache(**kw)


def checked_lookup(cache: PrefixCache, tokens, media=(), ns=NS):
    match = cache.lookup(ns, tokens, media)
    cache.check_invariants()
    return match


# -- rule 1: the longest valid prefix wins; ties go to the most recently used


def test_longest_prefix_over_all_entries_wins():
    cache = make()
    cache.insert(NS, [1, 2, 3, 9], [normal(4)])
    long = cache.insert(NS, [1, 2, 3, 4, 5, 8], [normal(6)])
    cache.insert(NS, [1, 2, 7], [normal(3)])
    match = checked_lookup(cache, [1, 2, 3, 4, 5, 6, 7])
    assert (match.entry, match.length) == (long, 5)


def test_tie_goes_to_the_most_recently_used():
    cache = make()
    a = cache.insert(NS, [1, 2, 3, 4], [normal(4)])
    b = cache.insert(NS, [1, 2, 3, 5], [normal(4)])
    assert checked_lookup(cache, [1, 2, 3, 6]).entry == b  # b was inserted last
    cache.lookup(NS, [1, 2, 3, 4, 0])  # a hit touches a (length 4 only a serves)
    assert checked_lookup(cache, [1, 2, 3, 6]).entry == a


def test_miss_when_nothing_shares_the_first_token():
    cache = make()
    cache.insert(NS, [1, 2, 3], [normal(3)])
    assert checked_lookup(cache, [2, 2, 3]) is None


# -- rule 2: media


def test_media_item_counts_only_when_inside_prefix_with_equal_hash_and_span():
    cache = make()
    cache.insert(NS, [1, 2, 50, 50, 50, 3, 4, 5], [normal(8)], media=[image(2, 5, "cat")])
    same = checked_lookup(cache, [1, 2, 50, 50, 50, 3, 4, 6], [image(2, 5, "cat")])
    assert same.length == 7
    assert same.media_reused[MediaKind.IMAGE] == 1 and same.media_to_encode[MediaKind.IMAGE] == 0


def test_swapped_media_reuses_only_the_text_before_it():
    cache = make()
    cache.insert(NS, [1, 2, 50, 50, 50, 3, 4, 5], [normal(8)], media=[image(2, 5, "cat")])
    swapped = checked_lookup(cache, [1, 2, 50, 50, 50, 3, 4, 6], [image(2, 5, "dog")])
    assert swapped.length == 2  # same tokens, same span, different picture: only [1, 2] is reusable
    assert swapped.media_reused[MediaKind.IMAGE] == 0 and swapped.media_to_encode[MediaKind.IMAGE] == 1


def test_same_hash_with_a_different_span_does_not_count():
    cache = make()
    cache.insert(NS, [1, 2, 50, 50, 50, 3], [normal(6)], media=[image(2, 5, "cat")])
    longer = checked_lookup(cache, [1, 2, 50, 50, 50, 50, 3], [image(2, 6, "cat")])
    assert longer.length == 2


def test_prefix_never_ends_inside_a_media_span():
    cache = make()
    # The cached sequence stops inside what the query has as one image: clamp to the image start.
    cache.insert(NS, [1, 2, 3, 50, 50], [normal(5)])
    match = checked_lookup(cache, [1, 2, 3, 50, 50, 50, 50, 9], [audio(3, 7, "song")])
    assert match.length == 3
    assert match.media_to_encode[MediaKind.AUDIO] == 1


def test_cached_span_straddling_the_match_clamps_to_its_start():
    cache = make()
    cache.insert(NS, [1, 2, 50, 50, 50, 50, 7], [normal(7)], media=[video(2, 6, "clip")])
    match = checked_lookup(cache, [1, 2, 50, 50, 9, 9])  # the query has plain text where the video was
    assert match.length == 2


def test_counts_per_kind_of_media_still_to_encode():
    cache = make()
    media = [image(1, 3, "i1"), audio(4, 6, "a1"), video(7, 9, "v1")]
    tokens = [1, 50, 50, 2, 60, 60, 3, 70, 70, 4]
    cache.insert(NS, tokens[:7], [normal(7)], media=media[:2])
    match = checked_lookup(cache, tokens, media)
    assert match.length == 7
    assert dict(match.media_reused) == {MediaKind.IMAGE: 1, MediaKind.AUDIO: 1, MediaKind.VIDEO: 0}
    assert dict(match.media_to_encode) == {MediaKind.IMAGE: 0, MediaKind.AUDIO: 0, MediaKind.VIDEO: 1}


def test_a_digest_collision_never_gives_a_wrong_hit(monkeypatch):
    import cache.media as media_mod

    monkeypatch.setattr(media_mod, "head_key", lambda span, token: -(2**40))  # every item collides
    monkeypatch.setattr("cache.prefix_cache.encode_keys", media_mod.encode_keys)
    cache = make()
    cache.insert(NS, [1, 2, 50, 50, 3, 4], [normal(6)], media=[image(2, 4, "cat")])
    match = checked_lookup(cache, [1, 2, 50, 50, 3, 4, 5], [image(2, 4, "dog")])
    assert match is not None and match.length == 2  # the exact check cut the prefix at the differing item


# -- rule 3: rotating layers (the seed's two tests, in our terms)

# A model with one full-attention layer and one sliding layer of window 4. Entry "rolled" has seen 10 tokens and
# holds only the last 3 rows (no margin); entry "young" has 6 tokens and still holds all of its rows.


def seed_cache() -> tuple[PrefixCache, int, int]:
    cache = make()
    rolled = cache.insert(NS, list(range(1, 11)), [normal(10), rotating(10, 4, rows=3)])
    young = cache.insert(NS, [1, 2, 3, 4, 5, 9], [normal(6), rotating(6, 4, rows=6)])
    return cache, rolled, young


def test_rolled_over_rotating_entry_is_skipped_for_a_shorter_prefix():
    cache, _rolled, young = seed_cache()
    query = [1, 2, 3, 4, 5, 6, 7, 99]
    match = checked_lookup(cache, query)
    assert (match.entry, match.length) == (young, 5)
    assert query[match.length :] == [6, 7, 99]


def test_rolled_over_rotating_entry_serves_its_exact_extension():
    cache, rolled, _young = seed_cache()
    query = list(range(1, 12))
    match = checked_lookup(cache, query)
    assert (match.entry, match.length) == (rolled, 10)
    assert query[match.length :] == [11]


def test_rotating_margin_allows_short_rewinds_and_restores_the_right_rows():
    cache = make()
    eid = cache.insert(NS, list(range(1, 21)), [rotating(20, 4, rows=6)])  # holds positions 14..19: margin 3
    for rewind_to, expected in ((17, 17), (18, 18), (16, 0)):
        query = [*list(range(1, rewind_to + 1)), 99]
        match = checked_lookup(cache, query)
        if expected == 0:
            assert match is None  # 16 needs rows 13..15; 13 is gone
            continue
        assert (match.entry, match.length) == (eid, expected)
        lease = cache.acquire(match, NS)
        layer = lease.layers[0]
        assert isinstance(layer, RotatingKV) and layer.seen == expected
        assert layer.keys[0, 0, :, 0].tolist() == [float(p) for p in range(expected - 3, expected)]
        cache.release(lease)


def test_rotating_entry_that_never_rolled_over_serves_any_length():
    cache = make()
    cache.insert(NS, [1, 2, 3, 4, 5], [rotating(5, 8, rows=5)])
    assert checked_lookup(cache, [1, 2, 7]).length == 2


# -- rule 4: recurrent layers


def test_recurrent_match_is_the_longest_snapshot_not_beyond_the_token_match():
    cache = make()
    eid = cache.insert(NS, list(range(1, 13)), [normal(12), recurrent({3, 7, 12})])
    match = checked_lookup(cache, [1, 2, 3, 4, 5, 6, 7, 8, 9, 0])  # tokens match 9
    assert (match.entry, match.length) == (eid, 7)
    lease = cache.acquire(match, NS)
    snap = lease.layers[1]
    assert isinstance(snap, RecurrentSnapshot) and snap.length == 7 and snap.tensors[0][0, 0].item() == 7.0
    assert set(lease.snapshots_upto[1]) == {3, 7} and lease.snapshots_upto[0] is None
    cache.release(lease)


def test_recurrent_state_is_copied_and_attention_is_not():
    cache = make()
    cache.insert(NS, [1, 2, 3, 4], [normal(4), recurrent({2, 4})])
    lease = cache.acquire(cache.lookup(NS, [1, 2, 3, 4, 5]), NS)
    kv, snap = lease.layers
    snap.tensors[0].add_(100)  # the model updates recurrent state in place
    again = cache.acquire(cache.lookup(NS, [1, 2, 3, 4, 5]), NS)
    assert again.layers[1].tensors[0][0, 0].item() == 4.0
    assert kv.keys.untyped_storage().data_ptr() == again.layers[0].keys.untyped_storage().data_ptr()
    cache.release(lease)
    cache.release(again)
    cache.check_invariants()


def test_recurrent_without_a_snapshot_in_range_misses():
    cache = make()
    cache.insert(NS, [1, 2, 3, 4, 5, 6], [recurrent({4, 6})])
    assert checked_lookup(cache, [1, 2, 3, 9]) is None


# -- rule 5: at least one token left to compute; an exact repeat still hits


def test_exact_repeat_hits_one_token_short():
    cache = make()
    eid = cache.insert(NS, [5, 6, 7, 8], [normal(4)])
    match = checked_lookup(cache, [5, 6, 7, 8])
    assert (match.entry, match.length, match.query_length) == (eid, 3, 4)


def test_exact_repeat_on_a_recurrent_model_uses_the_previous_snapshot():
    cache = make()
    cache.insert(NS, [5, 6, 7, 8], [recurrent({2, 4})])
    assert checked_lookup(cache, [5, 6, 7, 8]).length == 2


def test_single_token_query_never_hits():
    cache = make()
    cache.insert(NS, [5], [normal(1)])
    assert checked_lookup(cache, [5]) is None


# -- rule 6: namespaces and salts never cross


def test_namespaces_never_cross():
    cache = make()
    cache.insert(NS, [1, 2, 3, 4], [normal(4)])
    for other in (
        Namespace("model-b", "float32"),
        Namespace("model-a", "bfloat16"),
        Namespace("model-a", "float32", salt="tenant-2"),
    ):
        assert checked_lookup(cache, [1, 2, 3, 4, 5], ns=other) is None
    assert checked_lookup(cache, [1, 2, 3, 4, 5]).length == 4


def test_salt_is_not_shown_in_repr():
    assert "secret" not in repr(Namespace("m", "float32", salt="secret"))


# -- restore returns views for attention, the right extras and media


def test_restore_gives_views_extras_and_media():
    cache = make()
    layers = [normal(8), stateless()]
    cache.insert(NS, [1, 2, 50, 50, 3, 4, 5, 6], layers, media=[image(2, 4, "x")], extras=[(0, 0), (4, -2)])
    match = cache.lookup(NS, [1, 2, 50, 50, 3, 4, 9], [image(2, 4, "x")])
    lease = cache.acquire(match, NS)
    kv = lease.layers[0]
    assert isinstance(kv, NormalKV) and kv.length == 6
    assert kv.keys.data_ptr() == layers[0].keys.data_ptr()  # a view: nothing was copied
    assert torch.equal(kv.keys, layers[0].keys[..., :6, :])
    assert lease.extra == -2 and [s.content_hash for s in lease.media] == ["x"]
    assert lease.extras_upto == ((0, 0), (4, -2))
    cache.release(lease)
    short = cache.acquire(cache.lookup(NS, [1, 2, 9]), NS)
    assert short.extra == 0 and short.extras_upto == ((0, 0),) and short.media == ()
    cache.release(short)
    cache.check_invariants()


def test_tie_between_rotating_entries_goes_to_the_most_recent_even_with_a_larger_margin_need():
    cache = make()
    # Both serve length 6 of the query; the older one could also serve shorter lengths (smaller lo).
    older = cache.insert(NS, [1, 2, 3, 4, 5, 6, 7], [rotating(7, 3, rows=7)])
    newer = cache.insert(NS, [1, 2, 3, 4, 5, 6, 8], [rotating(7, 3, rows=2)])
    assert checked_lookup(cache, [1, 2, 3, 4, 5, 6, 7, 9]).entry == older  # 7 is only in older
    assert checked_lookup(cache, [1, 2, 3, 4, 5, 6, 9]).entry == older  # newer cannot rewind to 6
    cache.lookup(NS, [1, 2, 3, 4, 5, 6, 8, 9])  # touch newer
    assert checked_lookup(cache, [1, 2, 3, 4, 5, 6, 8, 1]).entry == newer
    assert checked_lookup(cache, [1, 2, 3, 4, 5, 6, 9]).entry == older


def test_tie_between_recurrent_snapshots_goes_to_the_most_recently_used():
    cache = make()
    a = cache.insert(NS, [1, 2, 3, 4, 5], [recurrent({3, 5})])
    b = cache.insert(NS, [1, 2, 3, 7, 7], [recurrent({3, 5})])
    assert checked_lookup(cache, [1, 2, 3, 9]).entry == b
    cache.lookup(NS, [1, 2, 3, 4, 5, 6])  # touch a
    assert checked_lookup(cache, [1, 2, 3, 9]).entry == a


def test_tie_at_equal_lo_goes_to_the_most_recent_rotating_entry():
    cache = make()
    a = cache.insert(NS, [1, 2, 3, 4, 5, 6], [rotating(6, 3, rows=6)])
    b = cache.insert(NS, [1, 2, 3, 4, 9, 9, 9], [rotating(7, 3, rows=5)])  # lo = 2 + 2 = 4
    cache.lookup(NS, [1, 2, 3, 4, 5, 6, 7])  # touch a (lo 0)
    assert checked_lookup(cache, [1, 2, 3, 4, 0]).entry == a
    cache.lookup(NS, [1, 2, 3, 4, 9, 9, 9, 9])  # touch b
    assert checked_lookup(cache, [1, 2, 3, 4, 0]).entry == b
