"""Subset proofs: many leaves proven under one root at once (what an export carries).

Each chosen leaf is also checked one at a time against an independent RFC 9162
implementation (pymerkle's inclusion proofs), so a subset proof that verifies proves no
more and no less than one audit path per leaf would.
"""

from __future__ import annotations

import math
import random

import pymerkle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from portal.consent.merkle import (
    InvalidProof,
    MemoryTree,
    OutOfRange,
    leaf_hash,
    root_from_subset_proof,
    subset_proof,
    subset_proof_ranges,
    verify_subset,
)


def _tree(size: int) -> tuple[list[bytes], MemoryTree]:
    entries = [f"event {i}".encode() for i in range(size)]
    return entries, MemoryTree(leaf_hash(entry) for entry in entries)


def _leaves(tree: MemoryTree, indices: list[int]) -> list[tuple[int, bytes]]:
    return [(i, tree.leaf_hash(i)) for i in indices]


@pytest.mark.parametrize("size", range(1, 9))
def test_every_subset_of_every_small_tree_verifies(size):
    _, tree = _tree(size)
    root = tree.root()
    for mask in range(1, 1 << size):
        chosen = [i for i in range(size) if mask >> i & 1]
        proof = list(subset_proof(tree.store, chosen, size))
        verify_subset(_leaves(tree, chosen), proof, tree_size=size, root_hash=root)
        # One leaf alone: the subset proof is its RFC 9162 audit path, in root-first order.
        if len(chosen) == 1:
            assert sorted(proof) == sorted(tree.inclusion_proof(chosen[0], size))


def test_the_whole_tree_needs_no_proof_and_a_contiguous_run_needs_few_hashes():
    _, tree = _tree(1000)
    assert list(subset_proof(tree.store, range(1000), 1000)) == []
    for start, end in [(0, 1), (17, 400), (999, 1000), (500, 1000), (3, 997)]:
        proof = list(subset_proof(tree.store, range(start, end), 1000))
        assert len(proof) <= 2 * math.ceil(math.log2(1000))
        verify_subset(
            _leaves(tree, list(range(start, end))), proof, tree_size=1000, root_hash=tree.root()
        )


def test_a_random_subset_of_a_thousand_leaves_against_pymerkle():
    entries, tree = _tree(1000)
    # pymerkle 7 with security on hashes leaves and nodes with RFC 9162's prefixes.
    reference = pymerkle.InmemoryTree.init_from_entries(
        entries, algorithm="sha256", disable_security=False
    )
    rng = random.Random(2026)
    for size in (1000, 777, 513):
        chosen = sorted(rng.sample(range(size), 40))
        proof = list(subset_proof(tree.store, chosen, size))
        root = reference.get_root(size)
        verify_subset(_leaves(tree, chosen), proof, tree_size=size, root_hash=root)
        for index in chosen:  # the same leaves, one audit path each, from the reference
            pymerkle.verify_inclusion(
                leaf_hash(entries[index]), root, reference.prove_inclusion(index + 1, size)
            )


@st.composite
def subsets(draw):
    size = draw(st.integers(1, 300))
    chosen = sorted(draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=size)))
    return size, chosen


@settings(max_examples=200, deadline=None)
@given(subsets(), st.data())
def test_every_change_to_a_leaf_a_proof_hash_the_root_or_the_set_is_caught(case, data):
    size, chosen = case
    _, tree = _tree(size)
    root = tree.root()
    leaves = _leaves(tree, chosen)
    proof = list(subset_proof(tree.store, chosen, size))
    verify_subset(leaves, proof, tree_size=size, root_hash=root)
    byte, mask = data.draw(st.integers(0, 31)), data.draw(st.integers(1, 255))

    def flip(value: bytes) -> bytes:
        changed = bytearray(value)
        changed[byte] ^= mask
        return bytes(changed)

    def refused(leaves_, proof_, size_=size, root_=root) -> bool:
        try:
            verify_subset(leaves_, proof_, tree_size=size_, root_hash=root_)
        except InvalidProof:
            return True
        return False

    which = data.draw(st.integers(0, len(leaves) - 1))
    altered = list(leaves)
    altered[which] = (altered[which][0], flip(altered[which][1]))
    assert refused(altered, proof)
    assert refused(leaves, proof, root_=flip(root))
    if proof:
        element = data.draw(st.integers(0, len(proof) - 1))
        assert refused(leaves, [*proof[:element], flip(proof[element]), *proof[element + 1 :]])
        assert refused(leaves, proof[:-1])  # one hash short
    assert refused(leaves, [*proof, root])  # one hash too many
    # A leaf claimed at another index, or a leaf dropped from the set.
    other = data.draw(st.integers(0, size - 1).filter(lambda i: i != leaves[which][0]))
    moved = sorted([*altered[:which], (other, leaves[which][1]), *altered[which + 1 :]])
    if len({i for i, _ in moved}) == len(moved):
        assert refused(moved, proof)
    if len(leaves) > 1:
        assert refused([*leaves[:which], *leaves[which + 1 :]], proof)
    # (RFC 9162 hashes no size into the root: the signed tree head binds it, as for one
    # audit path; test_merkle.py shows where another size gives the same walk.)


@pytest.mark.parametrize(
    ("indices", "size"),
    [([], 4), ([1, 1], 4), ([2, 1], 4), ([4], 4), ([-1], 4), ([0], 0), ([True], 4)],
)
def test_the_walk_refuses_what_is_not_an_increasing_set_of_leaves(indices, size):
    with pytest.raises(OutOfRange):
        list(subset_proof_ranges(indices, size))
    with pytest.raises(InvalidProof):
        root_from_subset_proof([(i, b"\0" * 32) for i in indices], [], size)


def test_a_proof_hash_of_the_wrong_length_is_refused():
    _, tree = _tree(5)
    proof = list(subset_proof(tree.store, [2], 5))
    with pytest.raises(InvalidProof):
        verify_subset(
            _leaves(tree, [2]), [proof[0][:31], *proof[1:]], tree_size=5, root_hash=tree.root()
        )
