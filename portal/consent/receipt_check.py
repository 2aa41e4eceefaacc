#!/usr/bin/env python3
"""Check a consent receipt offline: python3 verify_receipt.py RECEIPT.json [--log-key KEY].

A consent receipt (push-consent-portal/consent-receipt/1) is a person's record of their
notification choices, as the preference centre's "Download a receipt of your choices"
gives it. This checker needs Python 3.10+ and the ``cryptography`` package, nothing of the
portal: the same file is the portal's ``portal verify-receipt`` and ``tools/verify_receipt.py``.

It checks, and names the first thing that fails:

1. the receipt's Ed25519 signature, over the bytes ``push-consent-portal consent receipt
   v1`` and a newline, then the receipt without ``signature`` as sorted-key compact ASCII
   JSON, made with the consent log's key (``--log-key``: base64, or a file holding
   ``GET /api/consent-log/key``'s JSON; without it, the receipt's own ``log_key``, which
   proves the receipt intact but not whose log it is from);
2. the signed tree head (RFC 6962 §3.5's 50-byte TreeHeadSignature input, Ed25519), with
   ``tree_head_key``: the log key, or its predecessor when the key changed since the head
   was signed (the receipt's signature vouches for it);
3. every event: its leaf hash is SHA-256(0x00 ‖ the event's canonical bytes) (RFC 9162
   §2.1.1), its leaf index is its seq - 1, and its audit path leads to the head's root
   (RFC 9162 §2.1.3.2); it is about the receipt's person;
4. every purpose that names an event says exactly what that event says (topic number,
   state, on, notice version, both times, source), one purpose per topic and per event,
   and every event is named by a purpose; every notice version a purpose cites is listed;
   a purpose that names no event is ``not_given`` and gives no notice version, time or
   source;
5. with ``--tree-head LATER.json --consistency PROOF.json`` (``GET
   /api/consent-log/tree-head`` and ``…/consistency?from=M&to=N``, M the receipt's tree
   size): the later head is signed by the log key, and the RFC 9162 §2.1.4.2
   consistency proof shows the log it describes extends the receipt's tree: it was not
   rewritten since.

A JSON key given twice anywhere is refused (readers disagree on which copy counts), and
so is an empty ``--log-key``.

What it proves: the receipt's choices are events of the consent log, about this person,
as of the signed tree head (and, with a later head, that the log was not rewritten since).
The log records a topic by its number: a purpose's name, label, description, category and
basis are the portal's word, signed with the receipt but not proven by the log (the
output shows each choice's topic number beside its name).
What no receipt can prove: that an event is the person's latest for its topic, or that a
topic marked ``not_given`` has no event: a proof shows what is in the log, never what is
not.

Exit status 0 when the receipt checks, 1 when it does not, 2 when it cannot be read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import struct
import sys
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

if TYPE_CHECKING:  # not imported at run time: every millisecond of start-up is the person's
    from collections.abc import Sequence
    from typing import Any, TypeAlias

    # The log's key, or the keys the checker trusts (after a change of the log's key).
    Keys: TypeAlias = ed25519.Ed25519PublicKey | Sequence[ed25519.Ed25519PublicKey] | None

FORMAT = "push-consent-portal/consent-receipt/1"
SIGNATURE_CONTEXT = b"push-consent-portal consent receipt v1\n"
ALGORITHM = "Ed25519"
MAX_UINT64 = 2**64 - 1


# A purpose's ``state`` from its event's (previous_state, new_state): a "no" after a "yes"
# is a withdrawal, any other "no" a refusal.
def expected_state(previous_state: object, new_state: object) -> str | None:
    if new_state == "opt_in":
        return "given"
    if new_state == "opt_out":
        return "withdrawn" if previous_state == "opt_in" else "refused"
    return None


class ReceiptError(Exception):
    """The receipt does not check; the message says what failed."""


def canonical(document: Any) -> bytes:
    """Sorted-key compact ASCII JSON: the bytes the receipt's signature covers."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def signed_bytes(receipt: dict[str, Any]) -> bytes:
    unsigned = {name: value for name, value in receipt.items() if name != "signature"}
    return SIGNATURE_CONTEXT + canonical(unsigned)


def b64_field(value: object) -> bytes:
    """Standard base64 with padding, in its one spelling, or ValueError saying why not.

    One spelling per value: base64 leaves spare bits in its last character, so without
    this a byte of a file (in the one field a signature cannot cover, the signature
    itself) could change and the file still check. The consent log's own readers of
    tree heads, proofs and keys (``portal.consent.merkle``) hold their input to this
    rule too."""
    if not isinstance(value, str):
        raise ValueError("is not a base64 string")
    try:
        raw = base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raise ValueError("is not base64") from None
    if base64.b64encode(raw).decode("ascii") != value:
        raise ValueError("is not base64 in its one standard spelling")
    return raw


def _b64(value: object, what: str, size: int | None = None) -> bytes:
    try:
        raw = b64_field(value)
    except ValueError as error:
        raise ReceiptError(f"{what} {error}") from None
    if size is not None and len(raw) != size:
        raise ReceiptError(f"{what} is {len(raw)} bytes, not {size}")
    return raw


def _uint64(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UINT64:
        raise ReceiptError(f"{what} is not a whole number from 0 to 2^64 - 1")
    return value


def _int(value: object, what: str) -> int:
    if type(value) is not int:  # not a bool, not 4.0
        raise ReceiptError(f"{what} is not a whole number")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object hook: a key given twice is refused (JSON readers disagree on
    which copy wins, so a file could show one thing to a person and another to a checker)."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise ReceiptError(f"the key {key!r} is given twice in one object")
        document[key] = value
    return document


def load(data: bytes | str) -> Any:
    """Parse a receipt or a proof file: JSON, no key given twice."""
    try:
        return json.loads(data, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise ReceiptError("the JSON is nested too deeply") from None
    except ValueError as error:
        raise ReceiptError(f"not JSON ({error})") from None


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ReceiptError(f"{what} is not a JSON object")
    return value


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ReceiptError(f"{what} is not a list")
    return value


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def root_from_audit_path(leaf: bytes, index: int, size: int, path: list[bytes]) -> bytes:
    """RFC 9162 §2.1.3.2: the root an audit path leads to from leaf ``index`` of ``size``."""
    if index >= size:
        raise ReceiptError(f"leaf index {index} is not below the tree size {size}")
    fn, sn, result = index, size - 1, leaf
    for sibling in path:
        if sn == 0:
            raise ReceiptError("an audit path is longer than its leaf's path to the root")
        if fn & 1 or fn == sn:
            result = _node(sibling, result)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            result = _node(result, sibling)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ReceiptError("an audit path is shorter than its leaf's path to the root")
    return result


def consistency_roots(m: int, n: int, first_root: bytes, proof: list[bytes]) -> tuple[bytes, bytes]:
    """RFC 9162 §2.1.4.2: the two roots a consistency proof from size m to n leads to."""
    if m == n:
        if proof:
            raise ReceiptError("a consistency proof between equal sizes is empty")
        return first_root, first_root
    if not 0 < m < n:
        raise ReceiptError(f"no consistency proof goes from size {m} to size {n}")
    if not proof:
        raise ReceiptError("the consistency proof is empty")
    path = [first_root, *proof] if m & (m - 1) == 0 else list(proof)
    fn, sn = m - 1, n - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ReceiptError("the consistency proof is longer than the trees need")
        if fn & 1 or fn == sn:
            fr, sr = _node(c, fr), _node(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = _node(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ReceiptError("the consistency proof is shorter than the trees need")
    return fr, sr


def check_later_head(receipt: dict[str, Any], keys: Keys, later: object, proof: object) -> int:
    """The later signed head, signed by one of ``keys`` (the log's key may have changed
    since the receipt), extends the receipt's; returns its size."""
    size, _, root, _ = _tree_head(receipt.get("tree_head"))  # verified by verify_receipt
    trusted = _keys(keys)
    later_size, later_root = 0, b""
    for n, key in enumerate(trusted):
        try:
            later_size, later_root = _verified_tree_head(later, key, "the later tree head")
            break
        except ReceiptError as error:
            if n < len(trusted) - 1:
                continue
            if len(trusted) > 1:
                raise ReceiptError(
                    "the later tree head's signature verifies with none of the log keys given"
                ) from None
            raise ReceiptError(
                f"{error}; if the log's key changed since the receipt, pass both keys with "
                "--log-key"
            ) from None
    hashes = [
        _b64(value, f"consistency[{i}]", 32)
        for i, value in enumerate(
            _list(_object(proof, "the consistency proof").get("consistency"), "consistency")
        )
    ]
    if len(hashes) > 65:
        raise ReceiptError("the consistency proof is longer than any tree needs")
    first, second = consistency_roots(size, later_size, root, hashes)
    if first != root or second != later_root:
        raise ReceiptError(
            f"the log of size {later_size} does not extend the receipt's tree of size {size} "
            "(history rewritten?)"
        )
    return later_size


def parse_log_key(value: str) -> ed25519.Ed25519PublicKey:
    """The log key: base64 of the 32 raw bytes, the JSON ``{"key": …}`` of
    ``GET /api/consent-log/key``, or a file holding either."""
    text = value.strip()
    # os.path and open(), not pathlib: importing pathlib costs a fresh process ~4 ms.
    if not text.startswith("{") and len(text) < 4096 and os.path.isfile(text):  # noqa: PTH113
        text = _read(text).decode("utf-8").strip()
    value_b64: object = text
    if text.startswith("{"):
        try:
            value_b64 = _object(load(text), "the log key").get("key")
        except ReceiptError as error:
            raise ReceiptError(f"the log key's JSON does not read: {error}") from None
    raw = _b64(value_b64, "the log key", 32)
    return ed25519.Ed25519PublicKey.from_public_bytes(raw)


def _verify(key: ed25519.Ed25519PublicKey, signature: bytes, message: bytes, what: str) -> None:
    try:
        key.verify(signature, message)
    except InvalidSignature:
        raise ReceiptError(f"{what} does not verify with the log key") from None


def _tree_head(document: object) -> tuple[int, int, bytes, bytes]:
    head = _object(document, "tree_head")
    expected = {"tree_size", "timestamp", "sha256_root_hash", "tree_head_signature"}
    if set(head) != expected:
        raise ReceiptError(f"tree_head has fields {sorted(head)}, not {sorted(expected)}")
    size = _uint64(head["tree_size"], "tree_head.tree_size")
    timestamp = _uint64(head["timestamp"], "tree_head.timestamp")
    root = _b64(head["sha256_root_hash"], "tree_head.sha256_root_hash", 32)
    signature = _b64(head["tree_head_signature"], "tree_head.tree_head_signature", 64)
    return size, timestamp, root, signature


def _verified_tree_head(
    document: object, key: ed25519.Ed25519PublicKey, what: str
) -> tuple[int, bytes]:
    """(size, root) of a signed tree head whose signature (RFC 6962 §3.5's 50 bytes:
    version, type, timestamp, size, root) verifies with ``key``."""
    size, timestamp, root, signature = _tree_head(document)
    message = b"\x00\x01" + struct.pack(">QQ", timestamp, size) + root
    _verify(key, signature, message, f"{what}'s signature")
    return size, root


def _check_event(entry: object, n: int, size: int, root: bytes, person: str) -> dict[str, Any]:
    what = f"events[{n}]"
    event = _object(entry, what)
    text = event.get("event")
    if not isinstance(text, str):
        raise ReceiptError(f"{what}.event is not the event's canonical JSON text")
    leaf = hashlib.sha256(b"\x00" + text.encode("utf-8")).digest()
    if leaf != _b64(event.get("leaf_hash"), f"{what}.leaf_hash", 32):
        raise ReceiptError(f"{what}: leaf_hash is not the hash of the event (altered)")
    fields = _object(load(text), f"{what}.event")
    if canonical(fields) != text.encode("utf-8"):
        raise ReceiptError(f"{what}.event is not in canonical form")
    seq = _uint64(fields.get("seq"), f"{what}.event.seq")
    index = _uint64(event.get("leaf_index"), f"{what}.leaf_index")
    if index != seq - 1:
        raise ReceiptError(f"{what}: leaf_index {index} is not seq {seq} - 1")
    if _int(event.get("seq"), f"{what}.seq") != seq:
        raise ReceiptError(f"{what}: seq {event.get('seq')} is not the event's own {seq}")
    path = [
        _b64(value, f"{what}.audit_path[{i}]", 32)
        for i, value in enumerate(_list(event.get("audit_path"), f"{what}.audit_path"))
    ]
    if len(path) > 64:
        raise ReceiptError(f"{what}.audit_path is longer than any tree needs")
    if root_from_audit_path(leaf, index, size, path) != root:
        raise ReceiptError(
            f"{what} (seq {seq}): its audit path does not lead to the tree head's root"
        )
    if fields.get("subscriber_id") != person:
        raise ReceiptError(f"{what} (seq {seq}) is about someone else")
    return fields


def _check_purposes(receipt: dict[str, Any], events: dict[int, dict[str, Any]]) -> int:
    notices = set()
    for notice in _list(receipt.get("notices"), "notices"):
        version = _object(notice, "a notice").get("policy_version")
        if not isinstance(version, str):
            raise ReceiptError("a notice's policy_version is not text")
        notices.add(version)
    named: set[int] = set()
    topics: set[int] = set()
    slugs: set[str] = set()
    purposes = _list(receipt.get("purposes"), "purposes")
    for n, entry in enumerate(purposes):
        purpose = _object(entry, f"purposes[{n}]")
        slug = purpose.get("purpose_id")
        what = f"purposes[{n}] ({slug})"
        topic = _int(purpose.get("topic_id"), f"{what}.topic_id")
        if not isinstance(slug, str) or slug in slugs or topic in topics:
            raise ReceiptError(f"{what}: each topic is one purpose, named once")
        slugs.add(slug)
        topics.add(topic)
        if type(purpose.get("on")) is not bool:
            raise ReceiptError(f"{what}: on is not true or false")
        seq = purpose.get("event_seq")
        if seq is None:
            _check_no_choice(purpose, what)
            continue
        event = events.get(_int(seq, f"{what}.event_seq"))
        if event is None:
            raise ReceiptError(f"{what}: its event {seq} is not among the receipt's events")
        if seq in named:
            raise ReceiptError(f"{what}: event {seq} is named by another purpose too")
        named.add(seq)
        _check_choice(purpose, event, topic, what, notices)
    extra = sorted(set(events) - named)
    if extra:
        raise ReceiptError(f"events {extra} are named by no purpose")
    return len(purposes)


def _check_no_choice(purpose: dict[str, Any], what: str) -> None:
    """A purpose that names no event is not_given and claims nothing an event would say:
    no notice version, no time, no source that no proof stands behind."""
    if purpose.get("state") != "not_given" or purpose.get("consent_type") != "none":
        raise ReceiptError(f"{what}: a choice with no event must be not_given")
    for name in ("policy_version", "consent_timestamp", "recorded_at", "source"):
        if purpose.get(name) is not None:
            raise ReceiptError(f"{what}: {name} {purpose.get(name)!r}, but it names no event")


def _check_choice(
    purpose: dict[str, Any], event: dict[str, Any], topic: int, what: str, notices: set[str]
) -> None:
    """A purpose that names an event says exactly what the event says."""
    state = expected_state(event.get("previous_state"), event.get("new_state"))
    checks = {
        "topic_id": (topic, event.get("topic_id")),
        "state": (purpose.get("state"), state),
        "on": (purpose.get("on"), state == "given"),
        "consent_type": (purpose.get("consent_type"), "explicit"),
        "policy_version": (purpose.get("policy_version"), event.get("policy_version")),
        "consent_timestamp": (purpose.get("consent_timestamp"), event.get("decided_at")),
        "recorded_at": (purpose.get("recorded_at"), event.get("recorded_at")),
        "source": (purpose.get("source"), event.get("source")),
    }
    for name, (said, recorded) in checks.items():
        if said != recorded or type(said) is not type(recorded):
            raise ReceiptError(f"{what}: {name} {said!r}, the event says {recorded!r}")
    version = purpose.get("policy_version")
    if version is not None and version not in notices:
        raise ReceiptError(f"{what}: notice {version} is not listed")


def _keys(keys: Keys) -> list[ed25519.Ed25519PublicKey]:
    if keys is None:
        return []
    if isinstance(keys, ed25519.Ed25519PublicKey):
        return [keys]
    return list(keys)


def verify_receipt(receipt: object, log_key: Keys = None) -> dict[str, Any]:
    """Check a parsed receipt; return what was proven, or raise ``ReceiptError``.
    ``log_key``: the log's key, or the keys the checker trusts (today's and, after a change
    of the log's key, earlier ones): the receipt must be signed by one of them."""
    try:
        return _verify_receipt(receipt, log_key)
    except ReceiptError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as error:
        raise ReceiptError(f"the receipt is malformed ({type(error).__name__})") from None


def _verify_receipt(receipt: object, log_key: Keys) -> dict[str, Any]:
    document = _object(receipt, "the receipt")
    if document.get("format") != FORMAT:
        raise ReceiptError(f"format is {document.get('format')!r}, not {FORMAT!r}")
    if document.get("signature_algorithm") != ALGORITHM:
        raise ReceiptError(f"signature_algorithm is not {ALGORITHM}")
    own = _b64(document.get("log_key"), "log_key", 32)
    given = _keys(log_key)
    key = next(
        (k for k in given if k.public_bytes_raw() == own),
        None if given else ed25519.Ed25519PublicKey.from_public_bytes(own),
    )
    if key is None:
        raise ReceiptError(
            "the receipt names another log key than "
            + ("the one given" if len(given) == 1 else "those given")
            + " (if the log's key changed since the receipt, pass the earlier key with "
            "--log-key too)"
        )
    signature = _b64(document.get("signature"), "signature", 64)
    _verify(key, signature, signed_bytes(document), "the receipt's signature")
    # The key that signed the tree head: the log key, or (after the log key changed) the
    # earlier one, which the receipt's own signature vouches for.
    head_key_raw = _b64(document.get("tree_head_key"), "tree_head_key", 32)
    head_key = ed25519.Ed25519PublicKey.from_public_bytes(head_key_raw)
    size, root = _verified_tree_head(document.get("tree_head"), head_key, "the tree head")
    person = _object(document.get("pii_principal"), "pii_principal").get("subscriber_id")
    if not isinstance(person, str):
        raise ReceiptError("pii_principal.subscriber_id is missing")
    events: dict[int, dict[str, Any]] = {}
    for n, entry in enumerate(_list(document.get("events"), "events")):
        fields = _check_event(entry, n, size, root, person)
        if fields["seq"] in events:
            raise ReceiptError(f"events[{n}]: seq {fields['seq']} is listed twice")
        events[fields["seq"]] = fields
    purposes = _check_purposes(document, events)
    return {
        "purposes": purposes,
        "events": len(events),
        "tree_size": size,
        "root_hash": root.hex(),
        "key": base64.b64encode(key.public_bytes_raw()).decode(),
        "key_given": bool(given),
        "head_key": base64.b64encode(head_key_raw).decode() if head_key_raw != own else None,
        "choices": [
            (p.get("purpose_id"), p.get("topic_id"), p.get("state"), p.get("consent_timestamp"))
            for p in document["purposes"]
        ],
    }


def _say(text: str, *, error: bool = False) -> None:
    (sys.stderr if error else sys.stdout).write(text + "\n")


USAGE = (
    "usage: verify_receipt.py RECEIPT.json [--log-key KEY]... "
    "[--tree-head LATER.json --consistency PROOF.json]"
)
_OPTIONS = ("--log-key", "--tree-head", "--consistency")


class _Arguments:
    """The command line, read by hand: argparse alone costs a fresh process ~10 ms."""

    def __init__(self, argv: list[str]) -> None:
        self.receipt = ""
        self.log_key: list[str] = []
        self.tree_head: str | None = None
        self.consistency: str | None = None
        self.help = False
        words = list(argv)
        while words:
            word = words.pop(0)
            name, equals, value = word.partition("=")
            if word in ("-h", "--help"):
                self.help = True
            elif name in _OPTIONS:
                if not equals:
                    if not words:
                        raise ValueError(f"{name} needs a value")
                    value = words.pop(0)
                if name == "--log-key":
                    self.log_key.append(value)  # once per key the checker trusts
                else:
                    setattr(self, name[2:].replace("-", "_"), value)
            elif word.startswith("-") or self.receipt:
                raise ValueError(f"unexpected argument {word!r}")
            else:
                self.receipt = word
        if not self.receipt and not self.help:
            raise ValueError("the receipt's file is required")


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:  # noqa: PTH123 - see parse_log_key
        return handle.read()


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    try:
        args = _Arguments(words)
    except ValueError as error:
        _say(f"{USAGE}\nerror: {error}", error=True)
        return 2
    if args.help:
        _say(USAGE + "\n\n" + (__doc__ or ""))
        return 0
    if (args.tree_head is None) != (args.consistency is None):
        _say("error: --tree-head and --consistency go together", error=True)
        return 2
    try:
        if any(not value.strip() for value in args.log_key):
            raise ReceiptError("--log-key is empty")
        keys = [parse_log_key(value) for value in args.log_key]
        document = load(_read(args.receipt))
        later = (
            (load(_read(args.tree_head)), load(_read(args.consistency)))
            if args.tree_head is not None and args.consistency is not None
            else None
        )
    except (OSError, ValueError, RecursionError, ReceiptError) as error:
        _say(f"error: {error}", error=True)
        return 2
    try:
        proven = verify_receipt(document, keys)
        if later is not None:
            trusted = keys or [
                ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(proven["key"]))
            ]
            later_size = check_later_head(document, trusted, *later)
    except ReceiptError as error:
        _say(f"FAILED {args.receipt}: {error}", error=True)
        return 1
    signed_by = (
        f"signed by the log key {proven['key']}"
        if proven["key_given"]
        else f"signed by the key it names itself, {proven['key']} (NOT checked against the "
        "log's published key: pass --log-key)"
    )
    _say(
        f"{args.receipt}: OK: {proven['purposes']} choices, {proven['events']} events proven "
        f"in the consent log's signed tree head of size {proven['tree_size']} "
        f"(root {proven['root_hash']}), {signed_by}"
    )
    for purpose_id, topic_id, state, when in proven["choices"]:
        _say(f"  {purpose_id} (topic {topic_id}): {state}" + (f" at {when}" if when else ""))
    if proven["head_key"]:
        _say(f"  (the tree head was signed by the log's earlier key {proven['head_key']})")
    if later is not None:
        _say(
            f"the later signed tree head of size {later_size} is consistent with it: the log "
            "was not rewritten since, these events are still in it (later choices may follow)"
        )
    if not proven["key_given"]:
        _say(
            "note: checked with the key inside the receipt; pass --log-key with "
            "GET /api/consent-log/key to check it is the log's",
            error=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
