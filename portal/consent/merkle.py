"""The consent log's Merkle tree: RFC 9162 hashing, proofs, the sequencer's state, tree heads.

Pure and storage-independent (standard library and ``cryptography`` only, no Flask, no
SQLAlchemy), so that the sequencer, the API, ``verify-log`` and an offline verifier share
one copy of every rule:

- **Hashing** (RFC 9162 §2.1): ``leaf_hash``, ``node_hash``, ``merkle_tree_hash``.
- **The stored layout.** Every complete subtree of the log is a node ``(level, index)``
  covering the leaves ``[index·2^level, (index+1)·2^level)``; level 0 is the leaf hashes.
  A node exists once the tree has ``(index+1)·2^level`` leaves and never changes after,
  because the log only grows. Appending leaf ``n`` creates the leaf node ``(0, n)`` and
  one parent for each trailing 1-bit of ``n``; ``integrate`` returns exactly those rows
  (about two per leaf) with the new root. Every hash a proof needs, at the current size
  or any earlier one, is a fold of O(log n) such nodes (``range_nodes``), so proof
  generation asks a ``NodeSource`` for one batch of at most ``2·⌈log2 n⌉`` hashes and
  never reads the leaves.
- **The sequencer's state.** ``Frontier``: the hashes of the maximal complete subtrees
  (one per set bit of the size), enough to append and to compute the root; it
  serialises to ``1 + 8 + 32·popcount(size)`` bytes and can also be rebuilt from the
  stored nodes (``Frontier.from_source``).
- **Proofs.** Generation per RFC 9162 §2.1.3.1 (inclusion) and §2.1.4.1 (consistency);
  verification exactly per §2.1.3.2 and §2.1.4.2. A verifier refuses with ``InvalidProof``
  and nothing else.
- **Tree heads.** The 50-byte TreeHeadSignature input of RFC 6962 §3.5 (version v1,
  signature type tree_hash), signed with Ed25519; the JSON shapes of RFC 6962 §4.3–4.5
  (hashes and signatures in standard base64 with padding). The signature is the raw
  64-byte Ed25519 signature, not RFC 6962's TLS ``DigitallySigned`` wrapping. Parsers
  refuse anything else with ``MalformedInput``, naming the field.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from hmac import compare_digest
from typing import Any, NamedTuple, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from portal.consent.receipt_check import b64_field

HASH_SIZE = 32
SIGNATURE_SIZE = 64
PUBLIC_KEY_SIZE = 32
# Sizes, indexes and timestamps are uint64 on the wire (RFC 6962 §3.5).
MAX_UINT64 = 2**64 - 1
# A tree of at most 2^64 - 1 leaves is at most 64 levels deep: an audit path has at most
# 64 hashes, a consistency proof at most 65 (one per level and the first tree's subtree).
MAX_AUDIT_PATH = 64
MAX_CONSISTENCY_PROOF = 65
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
# MTH({}) = SHA-256 of the empty string (RFC 9162 §2.1.1).
EMPTY_ROOT = hashlib.sha256(b"").digest()
# RFC 6962 §3.5: Version v1 = 0, SignatureType tree_hash = 1.
_TREE_HEAD_PREFIX = b"\x00\x01"
_FRONTIER_VERSION = 1
_sha256 = hashlib.sha256


class MerkleError(ValueError):
    """Everything this module refuses."""


class InvalidProof(MerkleError):
    """An inclusion or consistency proof that does not verify, or is malformed."""


class InvalidTreeHead(MerkleError):
    """A tree head whose signature does not verify with the log's key."""


class OutOfRange(MerkleError):
    """A proof or root asked for outside the tree (index ≥ size, size beyond the tree)."""


class MissingNode(MerkleError):
    """A node source lacks a complete-subtree hash the tree of that size must have."""


class MalformedInput(MerkleError):
    """A document (JSON shape, serialised state) that is not what it must be."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# --- hashing (RFC 9162 §2.1) -------------------------------------------------------------


def leaf_hash(data: bytes) -> bytes:
    """SHA-256(0x00 ‖ data): the hash of one log entry."""
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 ‖ left ‖ right): the hash of an interior node."""
    return _sha256(NODE_PREFIX + left + right).digest()


def _split(width: int) -> int:
    """The largest power of two smaller than ``width`` (``width`` ≥ 2)."""
    return 1 << ((width - 1).bit_length() - 1)


def root_from_leaf_hashes(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH over leaves already hashed, by the RFC's recursion (the reference: O(n))."""

    def mth(start: int, end: int) -> bytes:
        if end - start == 1:
            return leaf_hashes[start]
        k = _split(end - start)
        return node_hash(mth(start, start + k), mth(start + k, end))

    return EMPTY_ROOT if not leaf_hashes else mth(0, len(leaf_hashes))


def merkle_tree_hash(entries: Sequence[bytes]) -> bytes:
    """MTH(D[n]) of RFC 9162 §2.1.1 over the raw entries."""
    return root_from_leaf_hashes([leaf_hash(entry) for entry in entries])


# --- the stored layout ------------------------------------------------------------------


class NodeId(NamedTuple):
    """A complete subtree: leaves ``[index·2^level, (index+1)·2^level)``."""

    level: int
    # The field shadows tuple.index on purpose: (level, index) is how the layout is named.
    index: int  # type: ignore[assignment]


class Node(NamedTuple):
    """A row to store: a complete subtree and its hash."""

    level: int
    index: int  # type: ignore[assignment]
    hash: bytes


def range_nodes(start: int, end: int) -> list[NodeId]:
    """The complete subtrees whose right fold is the RFC's hash of leaves ``[start, end)``.

    Defined for the subtrees the RFC's recursion produces (and every prefix
    ``[0, m)``): ``start`` is a multiple of the largest power of two not above
    ``end - start``, so the range splits into aligned subtrees of decreasing size, one
    per set bit of its width, and MTH(D[start:end]) = node(A, node(B, … Z)).
    """
    if not 0 <= start < end:
        raise OutOfRange(f"[{start}, {end}) is not a non-empty leaf range")
    nodes = []
    position = start
    while position < end:
        level = (end - position).bit_length() - 1
        if position % (1 << level):
            raise OutOfRange(f"[{start}, {end}) is not a subtree of the RFC 9162 tree")
        nodes.append(NodeId(level, position >> level))
        position += 1 << level
    return nodes


def fold(hashes: Sequence[bytes]) -> bytes:
    """node(h0, node(h1, … node(h[k-2], h[k-1]))): a range's hash from its ``range_nodes``."""
    result = hashes[-1]
    for left in reversed(hashes[:-1]):
        result = node_hash(left, result)
    return result


class NodeSource(Protocol):
    """Where proof generation reads complete-subtree hashes from (the database, memory)."""

    def node_hashes(self, nodes: Sequence[NodeId]) -> Sequence[bytes]:
        """The hashes of these nodes, in the same order; ``MissingNode`` for one not stored."""
        ...


def _resolve(source: NodeSource, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The hash of each range, from one batched lookup of the nodes they fold."""
    per_range = [range_nodes(start, end) for start, end in ranges]
    wanted = list(dict.fromkeys(node for nodes in per_range for node in nodes))
    hashes = list(source.node_hashes(wanted)) if wanted else []
    if len(hashes) != len(wanted):
        raise MissingNode(f"asked for {len(wanted)} nodes, the source gave {len(hashes)}")
    by_id = dict(zip(wanted, hashes, strict=True))
    for node, value in by_id.items():
        if not isinstance(value, bytes) or len(value) != HASH_SIZE:
            raise MissingNode(f"node {tuple(node)} is not a {HASH_SIZE}-byte hash")
    return [fold([by_id[node] for node in nodes]) for nodes in per_range]


# --- proof generation (RFC 9162 §2.1.3.1, §2.1.4.1) --------------------------------------


def _check_generation_size(size: int, name: str) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_UINT64:
        raise OutOfRange(f"{name} must be an integer from 0 to 2^64 - 1")


def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """The leaf ranges whose hashes make PATH(index, D[size]), from the leaf up."""
    _check_generation_size(index, "leaf index")
    _check_generation_size(size, "tree size")
    if index >= size:
        raise OutOfRange(f"leaf {index} is not in a tree of {size} leaves")
    ranges = []
    start, end = 0, size
    # PATH(m, D[n]) = PATH(m, D[0:k]) : MTH(D[k:n]) if m < k,
    #              = PATH(m - k, D[k:n]) : MTH(D[0:k]) otherwise.
    while end - start > 1:
        k = _split(end - start)
        if index < start + k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
    ranges.reverse()
    return ranges


def consistency_ranges(first: int, second: int) -> list[tuple[int, int]]:
    """The leaf ranges whose hashes make PROOF(first, D[second]), in the RFC's order."""
    _check_generation_size(first, "first tree size")
    _check_generation_size(second, "second tree size")
    if not 0 < first <= second:
        raise OutOfRange(f"a consistency proof needs 0 < first ≤ second (got {first} and {second})")
    ranges = []
    start, m, n = 0, first, second
    whole = True  # SUBPROOF's b: still in the subtree whose root the verifier holds
    # SUBPROOF(m, D[n], b) = SUBPROOF(m, D[0:k], b) : MTH(D[k:n]) if m ≤ k,
    #                      = SUBPROOF(m - k, D[k:n], false) : MTH(D[0:k]) otherwise.
    while m != n:
        k = _split(n)
        if m <= k:
            ranges.append((start + k, start + n))
            n = k
        else:
            ranges.append((start, start + k))
            start, m, n = start + k, m - k, n - k
            whole = False
    # SUBPROOF(m, D[m], false) = {MTH(D[m])}; with b true it is empty.
    if not whole:
        ranges.append((start, start + n))
    ranges.reverse()
    return ranges


def inclusion_proof(source: NodeSource, index: int, size: int) -> list[bytes]:
    """The audit path of leaf ``index`` in the tree of ``size`` leaves (RFC 9162 §2.1.3.1)."""
    return _resolve(source, inclusion_ranges(index, size))


def consistency_proof(source: NodeSource, first: int, second: int) -> list[bytes]:
    """The consistency proof from size ``first`` to ``second`` (RFC 9162 §2.1.4.1).

    Empty when the sizes are equal; RFC 9162 defines none from the empty tree.
    """
    return _resolve(source, consistency_ranges(first, second))


def tree_root(source: NodeSource, size: int) -> bytes:
    """The root of the tree's first ``size`` leaves, from ``popcount(size)`` stored nodes."""
    _check_generation_size(size, "tree size")
    return EMPTY_ROOT if size == 0 else _resolve(source, [(0, size)])[0]


# --- subset proofs (many leaves at once, for exports) -----------------------------------
#
# An export proves every one of its events is a leaf under its signed tree head. One
# audit path per event would repeat the upper levels for every row (a million events,
# about a gigabyte of proof); a subset proof gives each hash once. Walk the RFC 9162
# recursion MTH(D[a:b]) = node(MTH(D[a:a+k]), MTH(D[a+k:b])) from the root, left to
# right: a range holding none of the chosen leaves is one proof hash (its MTH); a range
# of one chosen leaf is that leaf; any other range splits. The proof is those hashes in
# the walk's order. Contiguous leaves need at most 2·⌈log2 n⌉ hashes; k scattered ones
# about k·log2(n/k). Both sides stream: the walk only ever looks at the next chosen index.


def _subset_walk(indices: Iterable[int], size: int) -> Iterable[tuple[bool, int, int]]:
    """(is_leaf, start, end) for each step of the walk over ``size`` leaves.

    ``indices`` must be strictly increasing and below ``size`` (``OutOfRange`` else).
    """
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_UINT64:
        raise OutOfRange("a subset proof needs a tree of 1 to 2^64 - 1 leaves")
    chosen = iter(indices)
    state = {"next": -1, "last": -1}

    def advance() -> None:
        value = next(chosen, None)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise OutOfRange("a leaf index must be an integer")
            if value <= state["last"] or value >= size:
                raise OutOfRange(
                    f"leaf indexes must increase and stay below {size} (got {value} "
                    f"after {state['last']})"
                )
            state["last"] = value
        state["next"] = -1 if value is None else value

    advance()
    if state["next"] < 0:
        raise OutOfRange("a subset proof needs at least one leaf")
    # An explicit stack (right half pushed first): the depth is at most 64 anyway.
    stack = [(0, size)]
    while stack:
        start, end = stack.pop()
        following = state["next"]
        if following < 0 or following >= end:
            yield False, start, end
        elif end - start == 1:
            yield True, start, end
            advance()
        else:
            k = _split(end - start)
            stack.append((start + k, end))
            stack.append((start, start + k))


def subset_proof_ranges(indices: Iterable[int], size: int) -> Iterable[tuple[int, int]]:
    """The leaf ranges whose hashes, in order, make the subset proof of ``indices``."""
    for is_leaf, start, end in _subset_walk(indices, size):
        if not is_leaf:
            yield start, end


def subset_proof(
    source: NodeSource, indices: Iterable[int], size: int, *, batch: int = 512
) -> Iterable[bytes]:
    """The subset proof's hashes, looked up ``batch`` ranges at a time."""
    pending: list[tuple[int, int]] = []
    for span in subset_proof_ranges(indices, size):
        pending.append(span)
        if len(pending) >= batch:
            yield from _resolve(source, pending)
            pending = []
    if pending:
        yield from _resolve(source, pending)


# --- the sequencer's state --------------------------------------------------------------


def _require_hash(value: object, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != HASH_SIZE:
        raise ValueError(f"{what} must be {HASH_SIZE} bytes")
    return value


class Frontier:
    """The right edge of the tree: the hashes of its maximal complete subtrees.

    One hash per set bit of ``size``, largest subtree first, so the state of a tree of
    10,000,000 leaves is 8 hashes. Enough to append leaves and to compute the root.
    """

    __slots__ = ("_hashes", "_size")

    def __init__(self, size: int = 0, hashes: Iterable[bytes] = ()) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_UINT64:
            raise ValueError("a frontier's size is an integer from 0 to 2^64 - 1")
        self._size = size
        self._hashes = [_require_hash(value, "a frontier hash") for value in hashes]
        if len(self._hashes) != size.bit_count():
            raise ValueError(f"a tree of {size} leaves has {size.bit_count()} frontier hashes")

    @property
    def size(self) -> int:
        return self._size

    @property
    def hashes(self) -> tuple[bytes, ...]:
        return tuple(self._hashes)

    def nodes(self) -> list[Node]:
        """The frontier as stored nodes (each is also a row of the node table)."""
        ids = range_nodes(0, self._size) if self._size else []
        return [
            Node(level, index, value)
            for (level, index), value in zip(ids, self._hashes, strict=True)
        ]

    def append(self, leaf: bytes) -> list[Node]:
        """Append one leaf hash; returns the nodes it completes, the leaf itself first."""
        index = self._size
        if index == MAX_UINT64:
            raise OutOfRange("the tree is full")
        value = _require_hash(leaf, "a leaf hash")
        hashes = self._hashes
        created = [Node(0, index, value)]
        level = 0
        # Each trailing 1-bit of the old size is a complete subtree of the same height
        # on the left: merge with it and carry up.
        while index & 1:
            value = _sha256(NODE_PREFIX + hashes.pop() + value).digest()
            level += 1
            index >>= 1
            created.append(Node(level, index, value))
        hashes.append(value)
        self._size += 1
        return created

    def root(self) -> bytes:
        """MTH of the whole tree: the right fold of the frontier."""
        return fold(self._hashes) if self._hashes else EMPTY_ROOT

    def copy(self) -> Frontier:
        return Frontier(self._size, self._hashes)

    def to_bytes(self) -> bytes:
        """``0x01 ‖ size (8, big-endian) ‖ hashes``: what the sequencer stores to resume."""
        return bytes([_FRONTIER_VERSION]) + struct.pack(">Q", self._size) + b"".join(self._hashes)

    @classmethod
    def from_bytes(cls, data: bytes) -> Frontier:
        if not isinstance(data, bytes):
            raise MalformedInput("frontier", "the state must be bytes")
        if len(data) < 9 or data[0] != _FRONTIER_VERSION:
            raise MalformedInput("frontier", "not a serialised frontier (version 1)")
        (size,) = struct.unpack(">Q", data[1:9])
        expected = 9 + HASH_SIZE * size.bit_count()
        if len(data) != expected:
            raise MalformedInput(
                "frontier",
                f"a tree of {size} leaves serialises to {expected} bytes, not {len(data)}",
            )
        return cls(size, [data[i : i + HASH_SIZE] for i in range(9, expected, HASH_SIZE)])

    @classmethod
    def from_source(cls, source: NodeSource, size: int) -> Frontier:
        """Rebuild the state from the stored nodes (one lookup of ``popcount(size)`` nodes)."""
        _check_generation_size(size, "tree size")
        if size == 0:
            return cls()
        ids = range_nodes(0, size)
        hashes = list(source.node_hashes(ids))
        if len(hashes) != len(ids):
            raise MissingNode(f"asked for {len(ids)} nodes, the source gave {len(hashes)}")
        try:
            return cls(size, hashes)
        except ValueError as error:
            raise MissingNode(str(error)) from error

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frontier):
            return NotImplemented
        return self._size == other._size and self._hashes == other._hashes

    def __hash__(self) -> int:
        return hash((self._size, tuple(self._hashes)))

    def __repr__(self) -> str:
        return f"Frontier(size={self._size}, root={self.root().hex()})"


@dataclass(frozen=True)
class Integration:
    """What appending a batch produces: the next state, the rows to store, the new root."""

    frontier: Frontier
    nodes: list[Node]
    root: bytes


def integrate(frontier: Frontier, leaf_hashes: Iterable[bytes]) -> Integration:
    """Append a batch to a copy of ``frontier`` (the given state is left as it was).

    ``nodes`` are every complete subtree the batch completes, as ``(level, index,
    hash)`` rows in the order they were made; storing them with the new state in one
    transaction keeps the node table and the state in step across a crash.
    """
    state = frontier.copy()
    nodes: list[Node] = []
    for leaf in leaf_hashes:
        nodes.extend(state.append(leaf))
    return Integration(state, nodes, state.root())


class MemoryNodeStore:
    """Complete-subtree hashes in memory: one ``bytearray`` per level.

    Nodes of a level are completed in index order, so each level is a packed array of
    32-byte hashes (about 64 bytes of memory per leaf in all).
    """

    def __init__(self) -> None:
        self._levels: list[bytearray] = []

    def add(self, nodes: Iterable[Node]) -> None:
        """Store nodes in the order ``integrate`` makes them; rewriting one must not change it."""
        for level, index, value in nodes:
            _require_hash(value, "a node hash")
            while len(self._levels) <= level:
                self._levels.append(bytearray())
            stored = self._levels[level]
            count = len(stored) // HASH_SIZE
            if index == count:
                stored += value
            elif index < count:
                if stored[index * HASH_SIZE : (index + 1) * HASH_SIZE] != value:
                    raise ValueError(f"node ({level}, {index}) is already stored with another hash")
            else:
                raise ValueError(f"node ({level}, {index}) would leave a gap at index {count}")

    def node_hashes(self, nodes: Sequence[NodeId]) -> list[bytes]:
        found = []
        for level, index in nodes:
            stored = self._levels[level] if 0 <= level < len(self._levels) else bytearray()
            if not 0 <= index < len(stored) // HASH_SIZE:
                raise MissingNode(f"node ({level}, {index}) is not stored")
            found.append(bytes(stored[index * HASH_SIZE : (index + 1) * HASH_SIZE]))
        return found

    def __len__(self) -> int:
        return sum(len(level) // HASH_SIZE for level in self._levels)


class MemoryTree:
    """A log in memory: the frontier and every complete subtree, as the database keeps them."""

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self.frontier = Frontier()
        self.store = MemoryNodeStore()
        self.extend(leaf_hashes)

    @property
    def size(self) -> int:
        return self.frontier.size

    def append(self, leaf: bytes) -> None:
        self.store.add(self.frontier.append(leaf))

    def extend(self, leaf_hashes: Iterable[bytes]) -> None:
        for leaf in leaf_hashes:
            self.append(leaf)

    def _size(self, size: int | None) -> int:
        if size is None:
            return self.size
        _check_generation_size(size, "tree size")
        if size > self.size:
            raise OutOfRange(f"the tree has {self.size} leaves, not {size}")
        return size

    def leaf_hash(self, index: int) -> bytes:
        if not 0 <= index < self.size:
            raise OutOfRange(f"leaf {index} is not in a tree of {self.size} leaves")
        return self.store.node_hashes([NodeId(0, index)])[0]

    def root(self, size: int | None = None) -> bytes:
        size = self._size(size)
        return self.frontier.root() if size == self.size else tree_root(self.store, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        return inclusion_proof(self.store, index, self._size(size))

    def consistency_proof(self, first: int, second: int | None = None) -> list[bytes]:
        return consistency_proof(self.store, first, self._size(second))


# --- proof verification (RFC 9162 §2.1.3.2, §2.1.4.2) ------------------------------------


def _check_size(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UINT64:
        raise InvalidProof(f"{name} must be an integer from 0 to 2^64 - 1")
    return value


def _check_digest(value: object, name: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != HASH_SIZE:
        raise InvalidProof(f"{name} must be a {HASH_SIZE}-byte hash")
    return value


def _check_path(path: object, name: str, limit: int) -> list[bytes]:
    if isinstance(path, (bytes, str)) or not isinstance(path, Sequence):
        raise InvalidProof(f"{name} must be a list of hashes")
    if len(path) > limit:
        raise InvalidProof(f"{name} has {len(path)} hashes; no tree needs more than {limit}")
    return [_check_digest(value, f"{name}[{i}]") for i, value in enumerate(path)]


def root_from_inclusion_proof(
    leaf: bytes, *, leaf_index: int, tree_size: int, audit_path: Sequence[bytes]
) -> bytes:
    """The root an audit path leads to from ``leaf`` (RFC 9162 §2.1.3.2, steps 1–4)."""
    leaf = _check_digest(leaf, "leaf hash")
    index = _check_size(leaf_index, "leaf index")
    size = _check_size(tree_size, "tree size")
    path = _check_path(audit_path, "audit path", MAX_AUDIT_PATH)
    if index >= size:
        raise InvalidProof(f"leaf index {index} is not below the tree size {size}")
    fn, sn = index, size - 1
    result = leaf
    for sibling in path:
        if sn == 0:
            raise InvalidProof("the audit path is longer than the leaf's path to the root")
        if fn & 1 or fn == sn:
            result = node_hash(sibling, result)
            # Skip the levels where the leaf's subtree is the right edge with no sibling.
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            result = node_hash(result, sibling)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise InvalidProof("the audit path is shorter than the leaf's path to the root")
    return result


def verify_inclusion(
    leaf: bytes, *, leaf_index: int, tree_size: int, audit_path: Sequence[bytes], root_hash: bytes
) -> None:
    """Refuse (``InvalidProof``) unless ``leaf`` is leaf ``leaf_index`` under ``root_hash``."""
    root_hash = _check_digest(root_hash, "root hash")
    computed = root_from_inclusion_proof(
        leaf, leaf_index=leaf_index, tree_size=tree_size, audit_path=audit_path
    )
    if not compare_digest(computed, root_hash):
        raise InvalidProof("the audit path leads to another root")


def verify_consistency(
    *,
    first: int,
    second: int,
    first_root: bytes,
    second_root: bytes,
    proof: Sequence[bytes],
) -> None:
    """Refuse (``InvalidProof``) unless the tree of ``first`` leaves is a prefix of ``second``'s.

    RFC 9162 §2.1.4.2 for 0 < first < second. Equal sizes need an empty proof and equal
    roots; RFC 9162 defines no proof from an empty tree, so ``first`` = 0 is refused.
    """
    m = _check_size(first, "first tree size")
    n = _check_size(second, "second tree size")
    first_root = _check_digest(first_root, "first root")
    second_root = _check_digest(second_root, "second root")
    path = _check_path(proof, "consistency proof", MAX_CONSISTENCY_PROOF)
    if m > n:
        raise InvalidProof(f"the first tree ({m} leaves) is larger than the second ({n})")
    if m == 0:
        raise InvalidProof("RFC 9162 defines no consistency proof from an empty tree")
    if m == n:
        if path:
            raise InvalidProof("the proof between two trees of the same size is empty")
        if not compare_digest(first_root, second_root):
            raise InvalidProof("two trees of the same size have different roots")
        return
    fr, sr = _consistency_roots(m, n, first_root, path)
    if not compare_digest(fr, first_root):
        raise InvalidProof("the consistency proof does not lead to the first root")
    if not compare_digest(sr, second_root):
        raise InvalidProof("the consistency proof does not lead to the second root")


def root_from_subset_proof(
    leaves: Iterable[tuple[int, bytes]], proof: Iterable[bytes], tree_size: int
) -> bytes:
    """The root that chosen leaves ``(index, leaf hash)``, in increasing index order, and a
    subset proof lead to in a tree of ``tree_size`` leaves; ``InvalidProof`` when the
    proof is too short or too long, or a leaf is out of order or out of range."""
    size = _check_size(tree_size, "tree size")
    queue = iter(leaves)
    hashes = iter(proof)
    current: dict[str, bytes] = {}

    def indices() -> Iterable[int]:
        for index, leaf in queue:
            current["leaf"] = _check_digest(leaf, f"leaf {index}")
            yield index

    # Each step's hash, combined bottom-up: (start, end, hash) entries on a stack merge
    # whenever the top two are the halves of one RFC 9162 range.
    done: list[tuple[int, int, bytes]] = []
    try:
        for is_leaf, start, end in _subset_walk(indices(), size):
            if is_leaf:
                value = current["leaf"]
            else:
                step = next(hashes, None)
                if step is None:
                    raise InvalidProof("the subset proof is shorter than the walk needs")
                value = _check_digest(step, "a subset proof hash")
            done.append((start, end, value))
            while len(done) >= 2:
                (ls, le, lh), (rs, re_, rh) = done[-2], done[-1]
                if le != rs or _parent_range(ls, re_, size) is None:
                    break
                done[-2:] = [(ls, re_, node_hash(lh, rh))]
    except OutOfRange as error:
        raise InvalidProof(str(error)) from None
    if next(hashes, None) is not None:
        raise InvalidProof("the subset proof is longer than the walk needs")
    if len(done) != 1 or done[0][:2] != (0, size):  # pragma: no cover - the walk covers all
        raise InvalidProof("the subset proof does not cover the tree")
    return done[0][2]


def _parent_range(start: int, end: int, size: int) -> tuple[int, int] | None:
    """(start, end) when it is a range the RFC 9162 recursion over ``size`` leaves visits."""
    low, high = 0, size
    while True:
        if (low, high) == (start, end):
            return start, end
        if high - low == 1 or not low <= start < end <= high:
            return None
        k = _split(high - low)
        if end <= low + k:
            high = low + k
        elif start >= low + k:
            low += k
        else:
            return None


def verify_subset(
    leaves: Iterable[tuple[int, bytes]], proof: Iterable[bytes], *, tree_size: int, root_hash: bytes
) -> None:
    """Refuse (``InvalidProof``) unless every ``(index, leaf hash)`` is under ``root_hash``."""
    root_hash = _check_digest(root_hash, "root hash")
    if not compare_digest(root_from_subset_proof(leaves, proof, tree_size), root_hash):
        raise InvalidProof("the subset proof leads to another root")


def _consistency_roots(m: int, n: int, first_root: bytes, path: list[bytes]) -> tuple[bytes, bytes]:
    """RFC 9162 §2.1.4.2 steps 1–7 for 0 < m < n: the two roots the proof leads to."""
    if not 0 < m < n:  # outside it the shifts below never reach 0 (m = 0 makes fn = -1)
        raise InvalidProof(f"RFC 9162 §2.1.4.2 is defined for 0 < first < second, not {m}, {n}")
    # 1. An empty proof fails.
    if not path:
        raise InvalidProof("the consistency proof is empty")
    # 2. The first tree's root is a node of the second when first is a power of two.
    if m & (m - 1) == 0:
        path = [first_root, *path]
    # 3.-4.
    fn, sn = m - 1, n - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    # 5.
    fr = sr = path[0]
    # 6.
    for c in path[1:]:
        if sn == 0:
            raise InvalidProof("the consistency proof is longer than the trees need")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    # 7. (the roots are compared by the caller)
    if sn != 0:
        raise InvalidProof("the consistency proof is shorter than the trees need")
    return fr, sr


# --- signed tree heads (RFC 6962 §3.5) --------------------------------------------------


def _field_uint64(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UINT64:
        raise MalformedInput(field, "must be an integer from 0 to 2^64 - 1")
    return value


def _field_bytes(value: object, field: str, size: int) -> bytes:
    if not isinstance(value, bytes) or len(value) != size:
        raise MalformedInput(field, f"must be {size} bytes")
    return value


def tree_head_signature_input(*, tree_size: int, timestamp: int, root_hash: bytes) -> bytes:
    """The 50 signed bytes: ``0x00 ‖ 0x01 ‖ timestamp (8) ‖ tree_size (8) ‖ root (32)``.

    RFC 6962's TreeHeadSignature with version v1 and signature type tree_hash; the
    integers big-endian, the timestamp in milliseconds since the epoch.
    """
    size = _field_uint64(tree_size, "tree_size")
    when = _field_uint64(timestamp, "timestamp")
    root = _field_bytes(root_hash, "sha256_root_hash", HASH_SIZE)
    return _TREE_HEAD_PREFIX + struct.pack(">QQ", when, size) + root


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _field_b64(value: object, field: str, size: int) -> bytes:
    """Standard base64 with padding, in its one spelling (the receipt checker's rule), of
    ``size`` bytes."""
    try:
        raw = b64_field(value)
    except ValueError as error:
        raise MalformedInput(field, str(error)) from None
    if len(raw) != size:
        raise MalformedInput(field, f"must encode {size} bytes, not {len(raw)}")
    return raw


def _fields(document: object, name: str, required: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(document, dict):
        raise MalformedInput(name, "must be a JSON object")
    for key in document:
        if key not in required:
            raise MalformedInput(str(key), f"is not a field of {name}")
    for key in required:
        if key not in document:
            raise MalformedInput(key, f"is missing from {name}")
    return document


def _field_path(value: object, field: str, limit: int) -> tuple[bytes, ...]:
    if not isinstance(value, list):
        raise MalformedInput(field, "must be a list of base64 hashes")
    if len(value) > limit:
        raise MalformedInput(field, f"has {len(value)} hashes; no tree needs more than {limit}")
    return tuple(_field_b64(item, f"{field}[{i}]", HASH_SIZE) for i, item in enumerate(value))


@dataclass(frozen=True)
class TreeHead:
    """A signed tree head: the log's size and root at a time, under the log's signature."""

    tree_size: int
    timestamp: int
    root_hash: bytes
    signature: bytes

    def __post_init__(self) -> None:
        _field_uint64(self.tree_size, "tree_size")
        _field_uint64(self.timestamp, "timestamp")
        _field_bytes(self.root_hash, "sha256_root_hash", HASH_SIZE)
        _field_bytes(self.signature, "tree_head_signature", SIGNATURE_SIZE)

    def signed_message(self) -> bytes:
        return tree_head_signature_input(
            tree_size=self.tree_size, timestamp=self.timestamp, root_hash=self.root_hash
        )

    def to_json(self) -> dict[str, Any]:
        """RFC 6962 §4.3's get-sth response shape."""
        return {
            "tree_size": self.tree_size,
            "timestamp": self.timestamp,
            "sha256_root_hash": _b64(self.root_hash),
            "tree_head_signature": _b64(self.signature),
        }

    @classmethod
    def from_json(cls, document: object) -> TreeHead:
        """Parse decoded JSON; exactly the four fields, else ``MalformedInput``."""
        fields = _fields(
            document,
            "a tree head",
            ("tree_size", "timestamp", "sha256_root_hash", "tree_head_signature"),
        )
        return cls(
            tree_size=_field_uint64(fields["tree_size"], "tree_size"),
            timestamp=_field_uint64(fields["timestamp"], "timestamp"),
            root_hash=_field_b64(fields["sha256_root_hash"], "sha256_root_hash", HASH_SIZE),
            signature=_field_b64(
                fields["tree_head_signature"], "tree_head_signature", SIGNATURE_SIZE
            ),
        )


def sign_tree_head(
    key: ed25519.Ed25519PrivateKey, *, tree_size: int, timestamp: int, root_hash: bytes
) -> TreeHead:
    """Sign the tree of ``tree_size`` leaves with ``root_hash`` at ``timestamp`` (ms)."""
    message = tree_head_signature_input(
        tree_size=tree_size, timestamp=timestamp, root_hash=root_hash
    )
    return TreeHead(tree_size, timestamp, root_hash, key.sign(message))


def verify_tree_head(key: ed25519.Ed25519PublicKey, head: TreeHead) -> None:
    """Refuse (``InvalidTreeHead``) a head the log's key did not sign."""
    try:
        key.verify(head.signature, head.signed_message())
    except InvalidSignature:
        raise InvalidTreeHead(
            "the tree head's signature does not verify with the log key"
        ) from None


def public_key_bytes(key: ed25519.Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def log_key_to_json(key: ed25519.Ed25519PublicKey) -> dict[str, str]:
    """``{"key"}``: the raw 32-byte Ed25519 public key, base64."""
    return {"key": _b64(public_key_bytes(key))}


def parse_log_key(document: object) -> ed25519.Ed25519PublicKey:
    fields = _fields(document, "a log key", ("key",))
    raw = _field_b64(fields["key"], "key", PUBLIC_KEY_SIZE)
    try:
        return ed25519.Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise MalformedInput("key", "is not an Ed25519 public key") from None


# --- proofs as JSON (RFC 6962 §4.4, §4.5) -----------------------------------------------


@dataclass(frozen=True)
class InclusionProof:
    """RFC 6962 §4.5's get-proof-by-hash response: the leaf's index and its audit path."""

    leaf_index: int
    audit_path: tuple[bytes, ...]

    def __post_init__(self) -> None:
        _field_uint64(self.leaf_index, "leaf_index")
        object.__setattr__(self, "audit_path", tuple(self.audit_path))
        if len(self.audit_path) > MAX_AUDIT_PATH:
            raise MalformedInput("audit_path", f"no tree needs more than {MAX_AUDIT_PATH} hashes")
        for i, value in enumerate(self.audit_path):
            _field_bytes(value, f"audit_path[{i}]", HASH_SIZE)

    def to_json(self) -> dict[str, Any]:
        return {"leaf_index": self.leaf_index, "audit_path": [_b64(h) for h in self.audit_path]}

    @classmethod
    def from_json(cls, document: object) -> InclusionProof:
        fields = _fields(document, "an inclusion proof", ("leaf_index", "audit_path"))
        return cls(
            leaf_index=_field_uint64(fields["leaf_index"], "leaf_index"),
            audit_path=_field_path(fields["audit_path"], "audit_path", MAX_AUDIT_PATH),
        )


@dataclass(frozen=True)
class ConsistencyProof:
    """RFC 6962 §4.4's get-sth-consistency response: the proof's hashes."""

    consistency: tuple[bytes, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "consistency", tuple(self.consistency))
        if len(self.consistency) > MAX_CONSISTENCY_PROOF:
            raise MalformedInput(
                "consistency", f"no tree needs more than {MAX_CONSISTENCY_PROOF} hashes"
            )
        for i, value in enumerate(self.consistency):
            _field_bytes(value, f"consistency[{i}]", HASH_SIZE)

    def to_json(self) -> dict[str, Any]:
        return {"consistency": [_b64(h) for h in self.consistency]}

    @classmethod
    def from_json(cls, document: object) -> ConsistencyProof:
        fields = _fields(document, "a consistency proof", ("consistency",))
        return cls(_field_path(fields["consistency"], "consistency", MAX_CONSISTENCY_PROOF))
