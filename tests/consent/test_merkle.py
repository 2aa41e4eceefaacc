"""The consent log's Merkle tree: known answers, an independent implementation, properties.

The known answers are Certificate Transparency's 8-leaf reference tree. The reference
implementation is pymerkle (RFC 9162 hashing): roots, audit paths and its own proofs are
compared with ours, and the consistency proofs with the RFC's SUBPROOF recursion written
out below over pymerkle's subtree roots.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import random
from functools import cache

import pymerkle
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from portal.consent import merkle
from portal.consent.merkle import (
    EMPTY_ROOT,
    ConsistencyProof,
    Frontier,
    InclusionProof,
    InvalidProof,
    InvalidTreeHead,
    MalformedInput,
    MemoryNodeStore,
    MemoryTree,
    MissingNode,
    Node,
    NodeId,
    OutOfRange,
    TreeHead,
    consistency_proof,
    consistency_ranges,
    inclusion_proof,
    inclusion_ranges,
    integrate,
    leaf_hash,
    merkle_tree_hash,
    node_hash,
    root_from_leaf_hashes,
    sign_tree_head,
    tree_head_signature_input,
    tree_root,
    verify_consistency,
    verify_inclusion,
    verify_tree_head,
)

h = bytes.fromhex

# --- known answers -----------------------------------------------------------------------

# The reference tree's leaf inputs: kInputs in google/certificate-transparency
# cpp/merkletree/merkle_tree_test.cc (commit 0e901cac), LeafInputs() in
# transparency-dev/merkle testonly/constants.go (commit 582a6ad1).
CT_LEAVES = [
    h(""),
    h("00"),
    h("10"),
    h("2021"),
    h("3031"),
    h("40414243"),
    h("5051525354555657"),
    h("606162636465666768696a6b6c6d6e6f"),
]

# Roots of its first 1…8 leaves: kSHA256Roots (merkle_tree_test.cc), RootHashes()
# (testonly/constants.go), roots (transparency-dev/merkle proof/verify_test.go).
CT_ROOTS = [
    h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
    h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
    h("aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77"),
    h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
    h("4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4"),
    h("76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef"),
    h("ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c"),
    h("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"),
]

# Every complete subtree of the 8-leaf tree, by level then index: NodeHashes() in
# transparency-dev/merkle testonly/constants.go (commit 582a6ad1).
CT_NODES = [
    [
        h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
        h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
        h("0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7"),
        h("07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7"),
        h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        h("4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658"),
        h("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
        h("46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1"),
    ],
    [
        h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
        h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
        h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
        h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
    ],
    [
        h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
    ],
    [h("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")],
]

# The frontier after each of the first 0…8 leaves: CompactTrees() in
# transparency-dev/merkle testonly/constants.go (commit 582a6ad1), as (level, index).
CT_FRONTIERS = [
    [],
    [(0, 0)],
    [(1, 0)],
    [(1, 0), (0, 2)],
    [(2, 0)],
    [(2, 0), (0, 4)],
    [(2, 0), (1, 2)],
    [(2, 0), (1, 2), (0, 6)],
    [(3, 0)],
]

# Audit paths, leaf indexes from 0: kSHA256Paths (merkle_tree_test.cc, leaves numbered
# from 1 there) and inclusionProofs (transparency-dev/merkle proof/verify_test.go, commit
# 02194e9a).
CT_INCLUSION = [
    (0, 1, []),
    (
        0,
        8,
        [
            h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
    ),
    (
        5,
        8,
        [
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
            h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (2, 3, [h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125")]),
    (
        1,
        5,
        [
            h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
]

# Consistency proofs: kSHA256Proofs (merkle_tree_test.cc) and consistencyProofs
# (transparency-dev/merkle proof/verify_test.go, which adds 6 → 7).
CT_CONSISTENCY = [
    (1, 1, []),
    (
        1,
        8,
        [
            h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
    ),
    (
        6,
        8,
        [
            h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (
        2,
        5,
        [
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
    (
        6,
        7,
        [
            h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            h("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
]

# sha256SomeHash of transparency-dev/merkle proof/verify_test.go: a hash of no node.
SOME_HASH = h("abacaba000000000000000000000000000000000000000000060061e00123456")


@pytest.fixture(scope="module")
def ct_tree() -> MemoryTree:
    return MemoryTree(leaf_hash(entry) for entry in CT_LEAVES)


def test_hashing_known_answers():
    # transparency-dev/merkle rfc6962/rfc6962_test.go (commit 78493b07), TestRFC6962Hasher.
    assert h("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == EMPTY_ROOT
    assert merkle_tree_hash([]) == EMPTY_ROOT
    assert leaf_hash(b"") == h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d")
    assert leaf_hash(b"L123456") == h(
        "395aa064aa4c29f7010acfe3f25db9485bbd4b91897b6ad7ad547639252b4d56"
    )
    assert node_hash(b"N123", b"N456") == h(
        "aa217fe888e47007fa15edab33c2b492a722cb106c64667fc2b044444de66bbb"
    )
    # The same rfc6962_test.go, TestRFC6962HasherCollisions: domain separation and order.
    one, two = leaf_hash(b"Hello"), leaf_hash(b"World")
    assert node_hash(one, two) != leaf_hash(one + two)
    assert node_hash(one, two) != node_hash(two, one)


def test_roots_of_the_reference_tree(ct_tree):
    frontier = Frontier()
    assert frontier.root() == EMPTY_ROOT
    for size in range(1, 9):
        expected = CT_ROOTS[size - 1]
        assert merkle_tree_hash(CT_LEAVES[:size]) == expected
        assert ct_tree.root(size) == expected
        assert tree_root(ct_tree.store, size) == expected
        frontier.append(leaf_hash(CT_LEAVES[size - 1]))
        assert frontier.root() == expected
    assert ct_tree.root(0) == EMPTY_ROOT


def test_the_stored_nodes_are_the_reference_trees_complete_subtrees(ct_tree):
    stored = integrate(Frontier(), [leaf_hash(entry) for entry in CT_LEAVES]).nodes
    expected = {
        (level, index): value
        for level, hashes in enumerate(CT_NODES)
        for index, value in enumerate(hashes)
    }
    assert {(n.level, n.index): n.hash for n in stored} == expected
    assert len(stored) == len(expected) == 15
    for (level, index), value in expected.items():
        assert ct_tree.store.node_hashes([NodeId(level, index)]) == [value]


def test_the_frontier_of_the_reference_tree():
    frontier = Frontier()
    for size, nodes in enumerate(CT_FRONTIERS):
        assert frontier.hashes == tuple(CT_NODES[level][index] for level, index in nodes)
        assert [(n.level, n.index) for n in frontier.nodes()] == nodes
        if size < 8:
            frontier.append(leaf_hash(CT_LEAVES[size]))


def _inclusion_probes(index, size, path, root, leaf):
    """corruptInclusionProof of transparency-dev/merkle proof/verify_test.go (and the
    equivalent VerifierCheck of merkle_tree_test.cc): each must be refused."""
    probes = [
        (index - 1, size, root, leaf, path, "leaf index - 1"),
        (index + 1, size, root, leaf, path, "leaf index + 1"),
        (index ^ 2, size, root, leaf, path, "leaf index ^ 2"),
        (index, size * 2, root, leaf, path, "tree size * 2"),
        (index, size // 2, root, leaf, path, "tree size / 2"),
        (index, size, root, b"WrongLeaf", path, "wrong leaf"),
        (index, size, EMPTY_ROOT, leaf, path, "empty root"),
        (index, size, SOME_HASH, leaf, path, "random root"),
        (index, size, root, leaf, [*path, b""], "trailing garbage"),
        (index, size, root, leaf, [*path, root], "trailing root"),
        (index, size, root, leaf, [b"", *path], "preceding garbage"),
        (index, size, root, leaf, [root, *path], "preceding root"),
    ]
    for i in range(len(path)):
        wrong = list(path)
        wrong[i] = bytes([wrong[i][0] ^ 8]) + wrong[i][1:]
        probes.append((index, size, root, leaf, wrong, f"modified path[{i}] bit 3"))
    if path:
        probes.append((index, size, root, leaf, path[:-1], "removed component"))
    if len(path) > 1:
        probes.append((index, size, root, leaf, [path[0], SOME_HASH, *path[1:]], "inserted"))
    return probes


def _consistency_probes(first, second, root1, root2, proof):
    """corruptConsistencyProof of transparency-dev/merkle proof/verify_test.go."""
    probes = [
        (first - 1, second, root1, root2, proof, "first - 1"),
        (first + 1, second, root1, root2, proof, "first + 1"),
        (first ^ 2, second, root1, root2, proof, "first ^ 2"),
        (first, second * 2, root1, root2, proof, "second * 2"),
        (first, second // 2, root1, root2, proof, "second / 2"),
        (first, second, b"WrongRoot", root2, proof, "wrong root1"),
        (first, second, root1, b"WrongRoot", proof, "wrong root2"),
        (first, second, root2, root1, proof, "swapped roots"),
        (first, second, root1, root2, [], "empty proof"),
        (first, second, root1, root2, [*proof, b""], "trailing garbage"),
        (first, second, root1, root2, [*proof, root1], "trailing root1"),
        (first, second, root1, root2, [*proof, root2], "trailing root2"),
        (first, second, root1, root2, [b"", *proof], "preceding garbage"),
        (first, second, root1, root2, [root1, *proof], "preceding root1"),
        (first, second, root1, root2, [root2, *proof], "preceding root2"),
        (first, second, root1, root2, [proof[0], *proof], "preceding proof[0]"),
        (first, second, root1, root2, proof[:-1], "truncated proof"),
    ]
    for i in range(len(proof)):
        wrong = list(proof)
        wrong[i] = bytes([wrong[i][0] ^ 16]) + wrong[i][1:]
        probes.append((first, second, root1, root2, wrong, f"modified proof[{i}] bit 4"))
    return probes


def _inclusion_refused(index, size, root, leaf, path) -> bool:
    try:
        verify_inclusion(leaf, leaf_index=index, tree_size=size, audit_path=path, root_hash=root)
    except InvalidProof:
        return True
    return False


def _consistency_refused(first, second, root1, root2, proof) -> bool:
    try:
        verify_consistency(
            first=first, second=second, first_root=root1, second_root=root2, proof=proof
        )
    except InvalidProof:
        return True
    return False


def _assert_inclusion_probes_refused(index, size, path, root, leaf):
    accepted = [
        desc
        for i, n, r, lf, p, desc in _inclusion_probes(index, size, path, root, leaf)
        if not _inclusion_refused(i, n, r, lf, p)
    ]
    assert accepted == []


def _assert_consistency_probes_refused(first, second, root1, root2, proof):
    accepted = [
        desc
        for m, n, r1, r2, p, desc in _consistency_probes(first, second, root1, root2, proof)
        if not _consistency_refused(m, n, r1, r2, p)
    ]
    assert accepted == []


@pytest.mark.parametrize(("index", "size", "expected"), CT_INCLUSION)
def test_inclusion_known_answers(ct_tree, index, size, expected):
    assert ct_tree.inclusion_proof(index, size) == expected
    leaf = leaf_hash(CT_LEAVES[index])
    root = CT_ROOTS[size - 1]
    verify_inclusion(leaf, leaf_index=index, tree_size=size, audit_path=expected, root_hash=root)
    _assert_inclusion_probes_refused(index, size, expected, root, leaf)


@pytest.mark.parametrize(("first", "second", "expected"), CT_CONSISTENCY)
def test_consistency_known_answers(ct_tree, first, second, expected):
    assert ct_tree.consistency_proof(first, second) == expected
    root1, root2 = CT_ROOTS[first - 1], CT_ROOTS[second - 1]
    verify_consistency(
        first=first, second=second, first_root=root1, second_root=root2, proof=expected
    )
    if expected:  # as upstream: the corruptions are of non-empty proofs
        _assert_consistency_probes_refused(first, second, root1, root2, expected)


def test_the_rfc_stops_at_the_root(ct_tree):
    """RFC 9162 §2.1.3.2 step 4a and §2.1.4.2 step 6a: a hash beyond the root fails the
    proof there, before any root is compared."""
    leaf = leaf_hash(CT_LEAVES[2])
    path = ct_tree.inclusion_proof(2, 3)
    with pytest.raises(InvalidProof, match="longer"):
        merkle.root_from_inclusion_proof(
            leaf, leaf_index=2, tree_size=3, audit_path=[*path, SOME_HASH]
        )
    with pytest.raises(InvalidProof, match="shorter"):
        merkle.root_from_inclusion_proof(leaf, leaf_index=2, tree_size=4, audit_path=path)
    proof = ct_tree.consistency_proof(6, 8)
    with pytest.raises(InvalidProof, match="longer"):
        verify_consistency(
            first=6,
            second=8,
            first_root=CT_ROOTS[5],
            second_root=CT_ROOTS[7],
            proof=[*proof, SOME_HASH],
        )
    with pytest.raises(InvalidProof, match="shorter"):
        verify_consistency(
            first=6, second=8, first_root=CT_ROOTS[5], second_root=CT_ROOTS[7], proof=proof[:-1]
        )


def test_a_single_leaf_tree():
    # TestVerifyInclusionSingleEntry of proof/verify_test.go: the root is the leaf hash.
    value = leaf_hash(b"data")
    verify_inclusion(value, leaf_index=0, tree_size=1, audit_path=[], root_hash=value)
    for leaf, root in ((value, b""), (b"", value), (b"", b"")):
        assert _inclusion_refused(0, 1, root, leaf, [])


# Leaf 1 of the 2-leaf reference tree: every row below changes one thing of a valid check.
L1, L0, R1, R2 = leaf_hash(CT_LEAVES[1]), leaf_hash(CT_LEAVES[0]), CT_ROOTS[0], CT_ROOTS[1]


@pytest.mark.parametrize(
    ("leaf", "index", "size", "path", "root"),
    [
        pytest.param(L1, True, 2, [L0], R2, id="a bool is not an index"),
        pytest.param(L1, 1.0, 2, [L0], R2, id="a float is not an index"),
        pytest.param(L1, "1", 2, [L0], R2, id="a string is not an index"),
        pytest.param(L1, 1, 2.0, [L0], R2, id="a float is not a size"),
        pytest.param(L1, 1, 2 + 2**64, [L0], R2, id="a size beyond uint64"),
        pytest.param(L1, -1, 2, [L0], R2, id="a negative index"),
        pytest.param(L1, 1, 1, [], L1, id="index = size"),
        pytest.param(L1, 2, 1, [], L1, id="index > size"),
        pytest.param(L1, 0, 0, [], EMPTY_ROOT, id="the empty tree has no leaf"),
        pytest.param(bytearray(L1), 1, 2, [L0], R2, id="a bytearray leaf"),
        pytest.param(L1, 1, 2, [bytearray(L0)], R2, id="a bytearray in the path"),
        pytest.param(L1, 1, 2, [L0], bytearray(R2), id="a bytearray root"),
        pytest.param(L1, 1, 2, [L0.hex()], R2, id="hex in the path"),
        pytest.param(L1, 1, 2, L0, R2, id="bytes are not a list of hashes"),
        pytest.param(L1, 1, 2, [L0[:31]], R2, id="31 bytes"),
        pytest.param(L1, 1, 2, [L0 + b"\x00"], R2, id="33 bytes"),
        pytest.param(L1, 1, 2, [L0] * 65, R2, id="longer than any tree"),
        pytest.param(L1, 1, 2, [], R2, id="too short"),
        pytest.param(L1, 1, 2, [L0, L0], R2, id="too long"),
        pytest.param(L1, 1, 2, [L0], R2[:31], id="a 31-byte root"),
        pytest.param(None, 1, 2, [L0], R2, id="no leaf"),
    ],
)
def test_verify_inclusion_refuses_malformed_input(leaf, index, size, path, root):
    verify_inclusion(L1, leaf_index=1, tree_size=2, audit_path=(L0,), root_hash=R2)
    with pytest.raises(InvalidProof):
        verify_inclusion(leaf, leaf_index=index, tree_size=size, audit_path=path, root_hash=root)


def test_verify_consistency_edge_cases():
    # TestVerifyConsistency of proof/verify_test.go, with RFC 9162's domain: the RFC
    # defines consistency proofs for 0 < first (trillian also accepts any first = 0).
    root1, root2 = leaf_hash(b"1"), leaf_hash(b"2")
    refused = [
        (0, 0, root1, root1, [], "no proof from an empty tree"),
        (0, 1, root1, root2, [], "no proof from an empty tree"),
        (0, 0, EMPTY_ROOT, EMPTY_ROOT, [], "no proof from an empty tree"),
        (1, 1, root1, root2, [], "equal sizes, different roots"),
        (1, 0, root1, root2, [], "time travel to the past"),
        (2, 1, root1, root2, [], "time travel to the past"),
        (1, 2, root1, root2, [], "empty proof"),
        (1, 1, EMPTY_ROOT, EMPTY_ROOT, [EMPTY_ROOT], "equal sizes, proof not empty"),
        (0, 1, EMPTY_ROOT, EMPTY_ROOT, [EMPTY_ROOT], "no proof from an empty tree"),
        (1, 2**64, root1, root2, [root1], "size beyond uint64"),
        (1, 2, root1, root2, [root1] * 66, "longer than any tree"),
        (1, 2, root1[:31], root2, [root1], "31-byte root"),
        (1, 2, root1, root2, [root1[:31]], "31-byte proof element"),
    ]
    # And one thing changed of the valid proof from 1 to 2 reference leaves.
    verify_consistency(first=1, second=2, first_root=R1, second_root=R2, proof=(L1,))
    refused += [
        (True, 2, R1, R2, [L1], "a bool is not a size"),
        (1.0, 2, R1, R2, [L1], "a float is not a size"),
        (1, 2.0, R1, R2, [L1], "a float is not a size"),
        (1, 2, bytearray(R1), R2, [L1], "a bytearray root"),
        (1, 2, R1, bytearray(R2), [L1], "a bytearray root"),
        (1, 2, R1, R2, [bytearray(L1)], "a bytearray in the proof"),
        (1, 2, R1, R2, L1, "bytes are not a list of hashes"),
        (1, 2, R1, R2, [L1.hex()], "hex in the proof"),
    ]
    accepted = [
        desc for m, n, r1, r2, p, desc in refused if not _consistency_refused(m, n, r1, r2, p)
    ]
    assert accepted == []
    # Equal sizes and equal roots are consistent with an empty proof.
    verify_consistency(first=1, second=1, first_root=root2, second_root=root2, proof=[])


junk = st.one_of(
    st.binary(min_size=32, max_size=32),
    st.binary(max_size=40),
    st.integers(-(2**65), 2**65),
    st.text(max_size=40),
    st.none(),
    st.booleans(),
    st.floats(),
)
junk_path = st.lists(st.binary(min_size=32, max_size=32) | junk, max_size=70) | junk


@settings(max_examples=300, deadline=None)
@given(
    leaf=junk,
    index=st.integers(-2, 2**64 + 2) | junk,
    size=st.integers(-2, 2**64 + 2) | junk,
    path=junk_path,
    root=junk,
)
def test_the_inclusion_verifier_says_no_and_nothing_else(leaf, index, size, path, root):
    with contextlib.suppress(InvalidProof):
        verify_inclusion(leaf, leaf_index=index, tree_size=size, audit_path=path, root_hash=root)


@settings(max_examples=300, deadline=None)
@given(
    first=st.integers(-2, 2**64 + 2) | junk,
    second=st.integers(-2, 2**64 + 2) | junk,
    root1=junk,
    root2=junk,
    proof=junk_path,
)
def test_the_consistency_verifier_says_no_and_nothing_else(first, second, root1, root2, proof):
    with contextlib.suppress(InvalidProof):
        verify_consistency(
            first=first, second=second, first_root=root1, second_root=root2, proof=proof
        )


# --- the independent implementation -------------------------------------------------------


def _pymerkle_tree(entries):
    # pymerkle 7 hashes leaves and nodes with the 0x00/0x01 prefixes unless security is off.
    return pymerkle.InmemoryTree.init_from_entries(
        entries, algorithm="sha256", disable_security=False
    )


def _reference_consistency(first, second, mth):
    """RFC 9162 §2.1.4.1 as written: PROOF(m, D[n]) = SUBPROOF(m, D[n], true)."""

    def subproof(m, start, n, whole):  # over D[start:start + n]
        if m == n:
            return [] if whole else [mth(start, start + n)]
        k = 1 << ((n - 1).bit_length() - 1)
        if m <= k:
            return [*subproof(m, start, k, whole), mth(start + k, start + n)]
        return [*subproof(m - k, start + k, n - k, False), mth(start, start + k)]

    return subproof(first, 0, second, True)


def _check_against_pymerkle(entries, pairs_inclusion, pairs_consistency):
    ours = MemoryTree(leaf_hash(entry) for entry in entries)
    reference = _pymerkle_tree(entries)
    # The reference's configuration matches RFC 9162: its leaf hash is ours.
    assert reference.get_leaf(1) == leaf_hash(entries[0])

    @cache
    def mth(start, end):
        return _pymerkle_tree(entries[start:end]).get_root()

    roots = {}

    def root(size):
        if size not in roots:
            roots[size] = reference.get_root(size)
            assert ours.root(size) == roots[size]
        return roots[size]

    for index, size in pairs_inclusion:
        path = ours.inclusion_proof(index, size)
        theirs = reference.prove_inclusion(index + 1, size)
        # pymerkle's path starts with the leaf's own hash; RFC 9162's audit path does not.
        assert theirs.path[0] == leaf_hash(entries[index])
        assert path == theirs.path[1:]
        pymerkle.verify_inclusion(leaf_hash(entries[index]), root(size), theirs)
        verify_inclusion(
            leaf_hash(entries[index]),
            leaf_index=index,
            tree_size=size,
            audit_path=path,
            root_hash=root(size),
        )
    for first, second in pairs_consistency:
        proof = ours.consistency_proof(first, second)
        assert proof == _reference_consistency(first, second, mth)
        # pymerkle's own proof (another layout) agrees that our roots are consistent.
        pymerkle.verify_consistency(
            root(first), root(second), reference.prove_consistency(first, second)
        )
        verify_consistency(
            first=first,
            second=second,
            first_root=root(first),
            second_root=root(second),
            proof=proof,
        )


def test_sizes_one_to_eight_against_pymerkle():
    for size in range(1, 9):
        entries = CT_LEAVES[:size]
        _check_against_pymerkle(
            entries,
            [(index, size) for index in range(size)],
            [(first, size) for first in range(1, size + 1)],
        )


def test_sizes_one_to_eight_proofs_refuse_every_corruption():
    tree = MemoryTree(leaf_hash(entry) for entry in CT_LEAVES)
    for size in range(1, 9):
        for index in range(size):
            path = tree.inclusion_proof(index, size)
            leaf = leaf_hash(CT_LEAVES[index])
            _assert_inclusion_probes_refused(index, size, path, tree.root(size), leaf)
        for first in range(1, size):
            proof = tree.consistency_proof(first, size)
            _assert_consistency_probes_refused(
                first, size, tree.root(first), tree.root(size), proof
            )


def test_a_random_thousand_leaf_tree_against_pymerkle():
    rng = random.Random(9162)
    entries = [rng.randbytes(rng.randrange(0, 48)) for _ in range(1000)]
    inclusion = [(index, 1000) for index in range(1000)]
    inclusion += [(rng.randrange(n), n) for n in (rng.randrange(1, 1001) for _ in range(300))]
    consistency = [(first, 1000) for first in range(1, 1001)]
    for _ in range(300):
        second = rng.randrange(1, 1001)
        consistency.append((rng.randrange(1, second + 1), second))
    _check_against_pymerkle(entries, inclusion, consistency)


# --- properties ---------------------------------------------------------------------------

unique_entries = st.lists(st.binary(max_size=12), min_size=1, max_size=70, unique=True)


def _flip(value: bytes, position: int, mask: int) -> bytes:
    changed = bytearray(value)
    changed[position % len(value)] ^= mask
    return bytes(changed)


@st.composite
def trees(draw):
    entries = draw(unique_entries)
    return entries, MemoryTree(leaf_hash(entry) for entry in entries)


@settings(max_examples=150, deadline=None)
@given(trees(), st.data())
def test_every_inclusion_proof_verifies_and_every_change_is_caught(tree_and_entries, data):
    entries, tree = tree_and_entries
    size = data.draw(st.integers(1, len(entries)), label="size")
    index = data.draw(st.integers(0, size - 1), label="index")
    leaf, root = leaf_hash(entries[index]), tree.root(size)
    path = tree.inclusion_proof(index, size)
    verify_inclusion(leaf, leaf_index=index, tree_size=size, audit_path=path, root_hash=root)

    # Any single byte of the leaf, of any proof element, of the root.
    byte = data.draw(st.integers(0, 31), label="byte")
    mask = data.draw(st.integers(1, 255), label="mask")
    assert _inclusion_refused(index, size, root, _flip(leaf, byte, mask), path)
    assert _inclusion_refused(index, size, _flip(root, byte, mask), leaf, path)
    if path:
        element = data.draw(st.integers(0, len(path) - 1), label="element")
        changed = list(path)
        changed[element] = _flip(changed[element], byte, mask)
        assert _inclusion_refused(index, size, root, leaf, changed)
    # Any other index (the leaves are distinct).
    other = data.draw(st.integers(0, 2**64 - 1).filter(lambda i: i != index), label="other")
    assert _inclusion_refused(other, size, root, leaf, path)
    # Any other leaf of the tree, rewritten.
    rewritten = data.draw(st.integers(0, size - 1), label="rewritten")
    forged = data.draw(st.binary(max_size=12).filter(lambda e: e not in entries), label="forged")
    changed_entries = [*entries[:rewritten], forged, *entries[rewritten + 1 :]]
    changed_root = merkle_tree_hash(changed_entries[:size])
    assert _inclusion_refused(index, size, changed_root, leaf, path)
    # The CT reference corruptions.
    _assert_inclusion_probes_refused(index, size, path, root, leaf)


def _directions(index, size):
    """For each audit path element, whether it is the left sibling (RFC 9162 §2.1.3.2)."""
    return [end <= index for _start, end in inclusion_ranges(index, size)]


@settings(max_examples=150, deadline=None)
@given(trees(), st.data())
def test_another_size_verifies_only_where_the_rfc_path_is_the_same(tree_and_entries, data):
    """RFC 9162 hashes no size into the tree: an audit path checks under another size
    exactly when that size gives the leaf the same path (leaf 0 in 3 and in 4 leaves).
    The size is bound by the signed tree head (test_the_head_binds_the_size)."""
    entries, tree = tree_and_entries
    size = data.draw(st.integers(1, len(entries)), label="size")
    index = data.draw(st.integers(0, size - 1), label="index")
    other = data.draw(st.integers(1, 2**64 - 1).filter(lambda n: n != size), label="other")
    leaf, root, path = leaf_hash(entries[index]), tree.root(size), tree.inclusion_proof(index, size)
    same_path = index < other and _directions(index, other) == _directions(index, size)
    assert _inclusion_refused(index, other, root, leaf, path) is not same_path


@settings(max_examples=150, deadline=None)
@given(trees(), st.data())
def test_every_consistency_proof_verifies_and_every_change_is_caught(tree_and_entries, data):
    entries, tree = tree_and_entries
    second = data.draw(st.integers(1, len(entries)), label="second")
    first = data.draw(st.integers(1, second), label="first")
    root1, root2 = tree.root(first), tree.root(second)
    proof = tree.consistency_proof(first, second)
    verify_consistency(first=first, second=second, first_root=root1, second_root=root2, proof=proof)

    byte = data.draw(st.integers(0, 31), label="byte")
    mask = data.draw(st.integers(1, 255), label="mask")
    assert _consistency_refused(first, second, _flip(root1, byte, mask), root2, proof)
    assert _consistency_refused(first, second, root1, _flip(root2, byte, mask), proof)
    if proof:
        element = data.draw(st.integers(0, len(proof) - 1), label="element")
        changed = list(proof)
        changed[element] = _flip(changed[element], byte, mask)
        assert _consistency_refused(first, second, root1, root2, changed)
        _assert_consistency_probes_refused(first, second, root1, root2, proof)

    # History rewritten: leaf j of the second tree replaced.
    j = data.draw(st.integers(0, second - 1), label="rewritten")
    forged = data.draw(st.binary(max_size=12).filter(lambda e: e not in entries), label="forged")
    rewritten = MemoryTree(
        leaf_hash(entry) for entry in [*entries[:j], forged, *entries[j + 1 : second]]
    )
    new_root = rewritten.root(second)
    # The old proof does not carry the old head to the new tree …
    assert _consistency_refused(first, second, root1, new_root, proof)
    honest = rewritten.consistency_proof(first, second)
    if j < first:
        # … and the rewritten tree's own proof does not either: the old head is not in it.
        assert _consistency_refused(first, second, root1, new_root, honest)
    else:
        # A change after the first tree leaves it a prefix: that is consistent.
        verify_consistency(
            first=first, second=second, first_root=root1, second_root=new_root, proof=honest
        )


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=8), max_size=20), max_size=12))
def test_batches_give_the_same_tree_however_they_are_cut(batches):
    """The frontier's root equals the full recomputation after any sequence of appends,
    and the rows ``integrate`` returns are exactly the complete subtrees, once each."""
    frontier, store, leaves = Frontier(), MemoryNodeStore(), []
    rows: list[Node] = []
    for batch in batches:
        hashes = [leaf_hash(entry) for entry in batch]
        before = frontier.to_bytes()
        step = integrate(frontier, hashes)
        assert frontier.to_bytes() == before  # integrate leaves its input alone
        leaves += hashes
        rows += step.nodes
        store.add(step.nodes)
        frontier = step.frontier
        assert step.root == frontier.root() == root_from_leaf_hashes(leaves)
        assert Frontier.from_bytes(frontier.to_bytes()) == frontier
    size = len(leaves)
    expected = {
        (level, index) for level in range(size.bit_length()) for index in range(size >> level)
    }
    assert len(rows) == len(expected) == 2 * size - size.bit_count()
    for level, index, value in rows:
        assert (level, index) in expected
        assert value == root_from_leaf_hashes(leaves[index << level : (index + 1) << level])
    assert Frontier.from_source(store, size) == frontier
    all_at_once = integrate(Frontier(), leaves)
    assert all_at_once.frontier == frontier
    assert all_at_once.nodes == rows


class Sequencer(RuleBasedStateMachine):
    """A sequencer that appends batches, crashes before or after storing them and
    resumes from its serialised state or from the stored nodes; the model is the plain
    list of leaves and the RFC's recursion over it."""

    def __init__(self) -> None:
        super().__init__()
        self.leaves: list[bytes] = []
        self.saved = Frontier().to_bytes()  # the committed state
        self.store = MemoryNodeStore()  # the committed node rows
        self.frontier = Frontier()  # the running process's state
        self.last: list[Node] = []

    @rule(batch=st.lists(st.binary(max_size=8), max_size=16))
    def integrate_and_commit(self, batch):
        step = integrate(self.frontier, [leaf_hash(entry) for entry in batch])
        # One transaction: the rows and the state.
        self.store.add(step.nodes)
        self.saved = step.frontier.to_bytes()
        self.frontier = step.frontier
        self.leaves += [leaf_hash(entry) for entry in batch]
        self.last = step.nodes

    @rule(batch=st.lists(st.binary(min_size=1, max_size=8), min_size=1, max_size=16))
    def crash_before_commit(self, batch):
        integrate(self.frontier, [leaf_hash(entry) for entry in batch])  # never stored
        self.frontier = Frontier.from_bytes(self.saved)

    @rule()
    def restart_from_saved_state(self):
        self.frontier = Frontier.from_bytes(self.saved)

    @rule()
    def restart_from_stored_nodes(self):
        self.frontier = Frontier.from_source(self.store, Frontier.from_bytes(self.saved).size)

    @precondition(lambda self: self.last)
    @rule()
    def rows_written_twice(self):
        self.store.add(self.last)  # a retried transaction rewrites identical rows

    @invariant()
    def agrees_with_the_recomputation(self):
        assert self.frontier.size == len(self.leaves)
        assert self.frontier.root() == root_from_leaf_hashes(self.leaves)
        assert tree_root(self.store, len(self.leaves)) == self.frontier.root()
        assert len(self.store) == 2 * len(self.leaves) - len(self.leaves).bit_count()
        assert Frontier.from_bytes(self.frontier.to_bytes()) == self.frontier


TestSequencer = Sequencer.TestCase
TestSequencer.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# --- storage: O(log n) lookups --------------------------------------------------------


class CountingSource:
    """Every complete subtree of a virtual tree of ``size`` leaves, with stand-in hashes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls: list[list[NodeId]] = []

    def node_hashes(self, nodes):
        self.calls.append(list(nodes))
        for level, index in nodes:
            assert (index + 1) << level <= self.size, "asked for a node the tree has not got"
        return [hashlib.sha256(f"{level}/{index}".encode()).digest() for level, index in nodes]


@pytest.mark.parametrize("size", [10_000_000, 2**23, 2**23 + 1, 2**40 - 1, 2**64 - 1])
def test_proofs_in_a_huge_tree_need_one_lookup_of_few_nodes(size):
    rng = random.Random(size)
    bound = 2 * (size - 1).bit_length()
    for index in [0, 1, size // 2, size - 2, size - 1, *(rng.randrange(size) for _ in range(50))]:
        source = CountingSource(size)
        assert len(inclusion_proof(source, index, size)) <= 64
        assert len(source.calls) == 1
        assert len(source.calls[0]) <= bound
    for first in [1, 2, size // 2, size - 1, size, *(rng.randrange(1, size) for _ in range(50))]:
        source = CountingSource(size)
        consistency_proof(source, first, size)
        assert len(source.calls) <= 1
        assert sum(len(call) for call in source.calls) <= bound
    source = CountingSource(size)
    tree_root(source, size)
    assert [len(call) for call in source.calls] == [size.bit_count()]


def test_proofs_for_an_earlier_size_read_only_nodes_of_that_size():
    tree = MemoryTree(leaf_hash(bytes([i])) for i in range(100))
    for size in range(1, 101):
        source = CountingSource(size)
        for index in range(size):
            inclusion_proof(source, index, size)
        for first in range(1, size + 1):
            consistency_proof(source, first, size)
        # The stored tree answers the same as a tree that stopped at that size.
        smaller = MemoryTree(leaf_hash(bytes([i])) for i in range(size))
        assert tree.root(size) == smaller.root()
        assert tree.inclusion_proof(size // 2, size) == smaller.inclusion_proof(size // 2)
        assert tree.consistency_proof(max(1, size // 3), size) == smaller.consistency_proof(
            max(1, size // 3)
        )


def test_generation_refuses_what_is_not_in_the_tree():
    tree = MemoryTree(leaf_hash(bytes([i])) for i in range(5))
    for call in (
        lambda: tree.inclusion_proof(5),
        lambda: tree.inclusion_proof(-1),
        lambda: tree.inclusion_proof(0, 6),
        lambda: tree.inclusion_proof(True, 2),
        lambda: tree.consistency_proof(0, 5),
        lambda: tree.consistency_proof(4, 3),
        lambda: tree.consistency_proof(1, 6),
        lambda: tree.root(6),
        lambda: tree.leaf_hash(5),
        lambda: inclusion_ranges(0, 2**64),
        lambda: consistency_ranges(1, 2**64),
    ):
        with pytest.raises(OutOfRange):
            call()
    with pytest.raises(MissingNode):
        inclusion_proof(MemoryNodeStore(), 0, 2)


def test_the_node_store_refuses_gaps_and_changed_rows():
    store = MemoryNodeStore()
    store.add([Node(0, 0, SOME_HASH)])
    store.add([Node(0, 0, SOME_HASH)])  # the same row again is fine
    with pytest.raises(ValueError, match="another hash"):
        store.add([Node(0, 0, EMPTY_ROOT)])
    with pytest.raises(ValueError, match="gap"):
        store.add([Node(0, 2, SOME_HASH)])
    with pytest.raises(ValueError, match="32 bytes"):
        store.add([Node(0, 1, b"short")])
    with pytest.raises(MissingNode):
        store.node_hashes([NodeId(1, 0)])
    with pytest.raises(MissingNode):
        store.node_hashes([NodeId(-1, 0)])
    assert len(store) == 1


def test_the_frontier_refuses_what_no_tree_has():
    with pytest.raises(ValueError, match="frontier hashes"):
        Frontier(3, [SOME_HASH])
    with pytest.raises(ValueError, match="32 bytes"):
        Frontier(1, [b"short"])
    with pytest.raises(ValueError, match="2\\^64"):
        Frontier(-1)
    with pytest.raises(ValueError, match="32 bytes"):
        Frontier().append(b"short")
    full = Frontier(2**64 - 1, [SOME_HASH] * 64)
    with pytest.raises(OutOfRange):
        full.append(SOME_HASH)
    with pytest.raises(MissingNode):
        Frontier.from_source(MemoryNodeStore(), 3)


def test_the_serialised_frontier_is_compact():
    frontier = Frontier()
    for i in range(10_000):
        frontier.append(leaf_hash(i.to_bytes(4, "big")))
    data = frontier.to_bytes()
    assert len(data) == 1 + 8 + 32 * (10_000).bit_count()
    assert data[:9] == b"\x01" + (10_000).to_bytes(8, "big")
    assert data[9:] == b"".join(frontier.hashes)
    for wrong in (data + b"\x00", data[:-1], b"\x02" + data[1:], data[:9]):
        with pytest.raises(MalformedInput, match="frontier"):
            Frontier.from_bytes(wrong)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_frontier_bytes_fuzz(data):
    try:
        frontier = Frontier.from_bytes(data)
    except MalformedInput as error:
        assert error.field == "frontier"
    else:
        assert frontier.to_bytes() == data


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(0, 400), st.integers(1, 255))
def test_a_changed_or_cut_frontier_is_refused_or_another_state(size, position, mask):
    frontier = Frontier()
    for i in range(size):
        frontier.append(leaf_hash(i.to_bytes(2, "big")))
    data = frontier.to_bytes()
    with pytest.raises(MalformedInput):
        Frontier.from_bytes(data[: position % len(data)])
    changed = _flip(data, position, mask)
    with contextlib.suppress(MalformedInput):
        assert Frontier.from_bytes(changed) != frontier


# --- signed tree heads ----------------------------------------------------------------


_KEY = ed25519.Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def log_key() -> ed25519.Ed25519PrivateKey:
    return _KEY


def test_the_signed_message_is_the_50_bytes_of_rfc_6962(log_key):
    root = bytes(range(32))
    message = tree_head_signature_input(
        tree_size=0x0102030405060708, timestamp=0x1112131415161718, root_hash=root
    )
    assert message == h(
        "00"  # Version v1
        "01"  # SignatureType tree_hash
        "1112131415161718"  # timestamp, ms, big-endian
        "0102030405060708"  # tree_size, big-endian
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"  # root
    )
    assert len(message) == 50
    head = sign_tree_head(
        log_key, tree_size=0x0102030405060708, timestamp=0x1112131415161718, root_hash=root
    )
    assert head.signed_message() == message
    # Plain Ed25519 over exactly those bytes, nothing else.
    log_key.public_key().verify(head.signature, message)
    assert log_key.sign(message) == head.signature  # Ed25519 is deterministic


def test_a_tree_head_round_trip(log_key):
    tree = MemoryTree(leaf_hash(entry) for entry in CT_LEAVES)
    head = sign_tree_head(log_key, tree_size=8, timestamp=1_767_225_600_000, root_hash=tree.root())
    verify_tree_head(log_key.public_key(), head)
    document = json.loads(json.dumps(head.to_json()))
    assert document == {
        "tree_size": 8,
        "timestamp": 1_767_225_600_000,
        "sha256_root_hash": "XcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=",
        "tree_head_signature": base64.b64encode(head.signature).decode(),
    }
    assert TreeHead.from_json(document) == head
    verify_tree_head(merkle.parse_log_key(merkle.log_key_to_json(log_key.public_key())), head)


def test_a_forged_tree_head_is_refused(log_key):
    head = sign_tree_head(log_key, tree_size=8, timestamp=1, root_hash=CT_ROOTS[7])
    other_key = ed25519.Ed25519PrivateKey.generate()
    forged = sign_tree_head(other_key, tree_size=8, timestamp=1, root_hash=CT_ROOTS[7])
    for bad in (
        forged,
        dataclasses.replace(head, signature=bytes(64)),
        dataclasses.replace(head, signature=forged.signature),
    ):
        with pytest.raises(InvalidTreeHead):
            verify_tree_head(log_key.public_key(), bad)
    with pytest.raises(InvalidTreeHead):
        verify_tree_head(other_key.public_key(), head)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.binary(min_size=32, max_size=32),
    st.integers(0, 50 + 64 - 1),
    st.integers(1, 255),
)
def test_any_changed_byte_of_a_tree_head_is_refused(size, timestamp, root, position, mask):
    key = _KEY
    head = sign_tree_head(key, tree_size=size, timestamp=timestamp, root_hash=root)
    verify_tree_head(key.public_key(), head)
    message, signature = head.signed_message(), head.signature
    if position < 50:
        message = _flip(message, position, mask)
    else:
        signature = _flip(signature, position - 50, mask)
    if message[:2] == b"\x00\x01":
        changed = TreeHead(
            tree_size=int.from_bytes(message[10:18], "big"),
            timestamp=int.from_bytes(message[2:10], "big"),
            root_hash=message[18:],
            signature=signature,
        )
        with pytest.raises(InvalidTreeHead):
            verify_tree_head(key.public_key(), changed)
    else:  # the two fixed bytes are no field of a head; the signature covers them too
        with pytest.raises(InvalidSignature):
            key.public_key().verify(signature, message)


def test_the_head_binds_the_size(log_key):
    """Leaf 0's audit path is the same shape in trees of 3 and 4 leaves, so a bare
    inclusion check cannot tell the sizes apart; the signed head does."""
    tree = MemoryTree(leaf_hash(entry) for entry in CT_LEAVES)
    path, root = tree.inclusion_proof(0, 3), tree.root(3)
    leaf = leaf_hash(CT_LEAVES[0])
    verify_inclusion(leaf, leaf_index=0, tree_size=4, audit_path=path, root_hash=root)
    head = sign_tree_head(log_key, tree_size=3, timestamp=5, root_hash=root)
    with pytest.raises(InvalidTreeHead):
        verify_tree_head(log_key.public_key(), dataclasses.replace(head, tree_size=4))


# --- the JSON shapes --------------------------------------------------------------------

SOME_HASH_B64 = base64.b64encode(SOME_HASH).decode()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=100),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=20), inner),
    max_leaves=20,
)


def _valid_head_document():
    return sign_tree_head(
        _KEY, tree_size=42, timestamp=1_700_000_000_000, root_hash=SOME_HASH
    ).to_json()


def _valid_inclusion_document():
    return InclusionProof(7, (SOME_HASH, EMPTY_ROOT)).to_json()


def _valid_consistency_document():
    return ConsistencyProof((SOME_HASH, EMPTY_ROOT, SOME_HASH)).to_json()


SHAPES = [
    (TreeHead.from_json, _valid_head_document),
    (InclusionProof.from_json, _valid_inclusion_document),
    (ConsistencyProof.from_json, _valid_consistency_document),
    (merkle.parse_log_key, lambda: merkle.log_key_to_json(_KEY.public_key())),
]


def _to_json(parsed):
    return (
        merkle.log_key_to_json(parsed)
        if isinstance(parsed, ed25519.Ed25519PublicKey)
        else parsed.to_json()
    )


@pytest.mark.parametrize(("parse", "valid"), SHAPES)
def test_the_json_shapes_round_trip(parse, valid):
    document = valid()
    assert _to_json(parse(json.loads(json.dumps(document)))) == document


@pytest.mark.parametrize(("parse", "valid"), SHAPES)
@settings(max_examples=150, deadline=None)
@given(value=json_values)
def test_any_json_value_is_a_document_or_refused(parse, valid, value):
    try:
        parsed = parse(value)
    except MalformedInput:
        return
    assert _to_json(parsed) == value


@pytest.mark.parametrize(("parse", "valid"), SHAPES)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_changed_field_is_refused_unless_it_is_valid(parse, valid, data):
    """Whatever a parser accepts, it writes back exactly as given: one spelling per
    document, so nothing a verifier reads is ignored."""
    document = valid()
    key = data.draw(st.sampled_from(sorted(document)), label="field")
    replacement = data.draw(
        json_values
        | st.integers(-(2**65), 2**65)
        | st.lists(st.binary(min_size=30, max_size=34).map(lambda b: base64.b64encode(b).decode()))
        | st.binary(max_size=70).map(lambda b: base64.b64encode(b).decode()),
        label="value",
    )
    changed = {**document, key: replacement}
    try:
        parsed = parse(changed)
    except MalformedInput as error:
        assert error.field.split("[")[0] == key
    else:
        assert _to_json(parsed) == changed


@pytest.mark.parametrize(("parse", "valid"), SHAPES)
def test_missing_and_unknown_fields_are_refused(parse, valid):
    document = valid()
    for key in document:
        with pytest.raises(MalformedInput, match="missing") as caught:
            parse({k: v for k, v in document.items() if k != key})
        assert caught.value.field == key
    with pytest.raises(MalformedInput, match="not a field") as caught:
        parse({**document, "comment": "signed?"})
    assert caught.value.field == "comment"
    for not_an_object in (None, [], "{}", 1, [document]):
        with pytest.raises(MalformedInput):
            parse(not_an_object)


@pytest.mark.parametrize(
    "spelling",
    [
        base64.urlsafe_b64encode(b"\xfb" * 32).decode(),  # the URL-safe alphabet
        base64.b64encode(b"\xfb" * 32).decode().rstrip("="),  # no padding
        " " + base64.b64encode(SOME_HASH).decode(),  # whitespace
        base64.b64encode(SOME_HASH).decode()[:20]
        + "\n"
        + base64.b64encode(SOME_HASH).decode()[20:],
        base64.b64encode(SOME_HASH).decode()[:-2] + "B=",  # non-canonical trailing bits
        base64.b64encode(SOME_HASH[:31]).decode(),  # 31 bytes
        base64.b64encode(SOME_HASH + b"\x00").decode(),  # 33 bytes
        SOME_HASH.hex(),  # hex
        "",
        "é" * 44,
    ],
)
def test_only_standard_padded_base64_of_the_right_length(spelling):
    for parse, document in (
        (TreeHead.from_json, {**_valid_head_document(), "sha256_root_hash": spelling}),
        (InclusionProof.from_json, {**_valid_inclusion_document(), "audit_path": [spelling]}),
        (ConsistencyProof.from_json, {"consistency": [SOME_HASH_B64, spelling]}),
    ):
        with pytest.raises(MalformedInput):
            parse(document)


def test_numbers_are_uint64_integers():
    for value in (-1, 2**64, 1.0, True, "42", None):
        with pytest.raises(MalformedInput, match="tree_size"):
            TreeHead.from_json({**_valid_head_document(), "tree_size": value})
        with pytest.raises(MalformedInput, match="timestamp"):
            TreeHead.from_json({**_valid_head_document(), "timestamp": value})
        with pytest.raises(MalformedInput, match="leaf_index"):
            InclusionProof.from_json({**_valid_inclusion_document(), "leaf_index": value})
    head = TreeHead.from_json({**_valid_head_document(), "tree_size": 2**64 - 1})
    assert head.tree_size == 2**64 - 1


def test_proof_lists_are_bounded():
    with pytest.raises(MalformedInput, match="audit_path"):
        InclusionProof.from_json({"leaf_index": 0, "audit_path": [SOME_HASH_B64] * 65})
    with pytest.raises(MalformedInput, match="consistency"):
        ConsistencyProof.from_json({"consistency": [SOME_HASH_B64] * 66})
    assert (
        len(
            InclusionProof.from_json(
                {"leaf_index": 0, "audit_path": [SOME_HASH_B64] * 64}
            ).audit_path
        )
        == 64
    )
    assert len(ConsistencyProof.from_json({"consistency": [SOME_HASH_B64] * 65}).consistency) == 65


def test_a_parsed_proof_verifies_and_a_parsed_key_is_the_key():
    tree = MemoryTree(leaf_hash(entry) for entry in CT_LEAVES)
    inclusion = InclusionProof.from_json(
        json.loads(json.dumps(InclusionProof(5, tuple(tree.inclusion_proof(5))).to_json()))
    )
    verify_inclusion(
        leaf_hash(CT_LEAVES[5]),
        leaf_index=inclusion.leaf_index,
        tree_size=8,
        audit_path=inclusion.audit_path,
        root_hash=tree.root(),
    )
    consistency = ConsistencyProof.from_json(
        {"consistency": [base64.b64encode(x).decode() for x in tree.consistency_proof(3)]}
    )
    verify_consistency(
        first=3,
        second=8,
        first_root=tree.root(3),
        second_root=tree.root(),
        proof=consistency.consistency,
    )
    raw = merkle.public_key_bytes(_KEY.public_key())
    assert merkle.log_key_to_json(_KEY.public_key()) == {"key": base64.b64encode(raw).decode()}
    with pytest.raises(MalformedInput, match="key"):
        merkle.parse_log_key({"key": base64.b64encode(raw[:31]).decode()})
