"""Checking an export bundle offline: no database, only the files and a public key.

Every problem names the file and the check that failed. The checks: the manifest's
Ed25519 signature (with the key given, else the manifest's own — which proves the bundle
is intact, not who made it), that the manifest is byte for byte as the exporter lays it
out (the signature covers its content, so this catches an edit that changes only
spacing), the data file's SHA-256 and row count, each policy text's
SHA-256, each event's RFC 9162 leaf hash against its content (and, for the events written
before the tree, their hash chain), that every event is a leaf under the manifest's signed
tree head — its signature checked with the consent log's key, and the subset proof in
``tree-proof.txt`` leading from the exported leaf hashes to its root — and that the rows
are the ones the manifest describes (order, first and last events, filters, cited policy
versions). Given a later signed tree head and a consistency proof from the export's head
to it (both as the log's API serves them), it checks the later log still holds the export.
"""

from __future__ import annotations

import abc
import csv
import datetime as dt
import hashlib
import io
import itertools
import json
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric import ed25519

from portal.compliance.export import (
    COLUMNS,
    FORMAT,
    MANIFEST,
    PROOF_FILE,
    TEXT_COLUMNS,
    canonical,
    manifest_bytes,
    restore,
)
from portal.compliance.signing import ALGORITHM, PublicKey
from portal.consent import merkle, receipt_check
from portal.consent.log import canonical as event_canonical
from portal.consent.log import chain_hash, event_fields

# Columns that may be NULL in the log: an empty CSV cell reads back as None.
_NULLABLE = frozenset(
    {
        "subscription_id",
        "topic_id",
        "topic_slug",
        "topic_label",
        "previous_state",
        "new_state",
        "policy_version",
    }
)
# The bundle formats this tool reads: 3 carries the tree proof; 2 and 1 came before it
# (docs/compliance.md) and are read with the checks they allow.
KNOWN_FORMATS = frozenset(
    {FORMAT, "push-consent-portal/consent-export/2", "push-consent-portal/consent-export/1"}
)
_ROW_PROBLEMS_SHOWN = 20
# The exporter's manifest nests four levels; a hand-edited one gets some room, no more.
_MANIFEST_DEPTH = 16


@dataclass(frozen=True)
class Problem:
    file: str
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.check}: {self.message}"


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    rows: int = 0
    key: PublicKey | None = None
    key_given: bool = False
    data_sha256: str | None = None
    # The tree head every exported event was proven under (None: no proof in the bundle).
    proven_head: merkle.TreeHead | None = None
    log_key_given: bool = False
    later_head: merkle.TreeHead | None = None  # a later head the export is consistent with

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, file: str, check: str, message: str) -> None:
        self.problems.append(Problem(file, check, message))


class BundleError(Exception):
    """Not a bundle at all (no such folder or zip, or no manifest in it)."""


class _Bundle(abc.ABC):
    """A bundle's files, wherever they are: a folder or a zip."""

    @abc.abstractmethod
    def open(self, name: str) -> IO[bytes] | None:
        """The named file for reading, or None when the bundle has no such file."""


class _Folder(_Bundle):
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def open(self, name: str) -> IO[bytes] | None:
        path = (self.root / name).resolve()
        if not path.is_relative_to(self.root) or not path.is_file():
            return None
        return path.open("rb")


class _Zip(_Bundle):
    def __init__(self, path: Path) -> None:
        self.archive = zipfile.ZipFile(path)
        manifests = [n for n in self.archive.namelist() if PurePosixPath(n).name == MANIFEST]
        if len(manifests) != 1:
            raise BundleError(f"{path} holds {len(manifests)} manifest.json files, not one")
        self.prefix = manifests[0][: -len(MANIFEST)]

    def open(self, name: str) -> IO[bytes] | None:
        try:
            return self.archive.open(self.prefix + name)
        except KeyError:
            return None


def _open_bundle(path: Path) -> _Bundle:
    if path.is_dir():
        if not (path / MANIFEST).is_file():
            raise BundleError(f"{path} has no {MANIFEST}: not an export bundle")
        return _Folder(path)
    if path.is_file() and zipfile.is_zipfile(path):
        return _Zip(path)
    raise BundleError(f"{path} is neither an export folder nor a .zip bundle")


def _safe_name(name: object) -> str | None:
    """A file name from the manifest, only when it stays inside the bundle."""
    if not isinstance(name, str) or not name:
        return None
    parts = PurePosixPath(name).parts
    if name.startswith("/") or ".." in parts or "\\" in name:
        return None
    return name


def _sha256(handle: IO[bytes]) -> str:
    digest = hashlib.sha256()
    with handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class LaterHead:
    """A later signed tree head and the consistency proof from the export's head to it
    (``GET /api/consent-log/tree-head`` and ``…/consistency?from=M&to=N``)."""

    head: merkle.TreeHead
    proof: merkle.ConsistencyProof


def parse_log_key(value: str) -> ed25519.Ed25519PublicKey:
    """The consent log's key: base64 of the 32 raw bytes, the JSON of
    ``GET /api/consent-log/key``, or a file holding either. The receipt checker's reading,
    so a key one checker takes the other takes too."""
    try:
        return receipt_check.parse_log_key(value)
    except (OSError, UnicodeDecodeError, receipt_check.ReceiptError) as error:
        raise ValueError(str(error)) from None


def parse_log_keys(values: Sequence[str]) -> list[ed25519.Ed25519PublicKey]:
    """Each ``--log-key`` given (see :func:`parse_log_key`); ValueError names a bad one."""
    keys = []
    for value in values:
        if not value.strip():
            raise ValueError("the log key is empty")
        keys.append(parse_log_key(value))
    return keys


def verify_bundle(
    path: Path,
    public_key: PublicKey | None = None,
    *,
    log_keys: Sequence[ed25519.Ed25519PublicKey] = (),
    later: LaterHead | None = None,
) -> Report:
    """``log_keys``: the consent log's keys the checker trusts (its current key and, after
    a change of key, the earlier ones): the export's head must be signed by one of them,
    and so must a later head. None given: the manifest's own log key, for both."""
    bundle = _open_bundle(path)
    report = Report(key_given=public_key is not None, log_key_given=bool(log_keys))
    handle = bundle.open(MANIFEST)
    if handle is None:
        raise BundleError(f"{path} has no {MANIFEST}")
    with handle:
        raw = handle.read()
    try:
        manifest = json.loads(raw)
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except RecursionError:
        manifest = None
    except (ValueError, UnicodeDecodeError) as problem:
        report.add(MANIFEST, "format", f"not a JSON object ({problem})")
        return report
    if manifest is None or _depth(manifest) > _MANIFEST_DEPTH:
        # Checked before anything walks it: re-encoding a deep document recurses too.
        report.add(
            MANIFEST,
            "format",
            f"nested deeper than an export manifest is (at most {_MANIFEST_DEPTH} levels)",
        )
        return report
    _check_signature(manifest, public_key, report)
    if manifest.get("format") not in KNOWN_FORMATS:
        # An unknown format would pass without the checks its version brought (a bundle
        # re-labelled with another format skipped its tree proof): refused, not guessed at.
        report.add(
            MANIFEST,
            "format",
            f"format {manifest.get('format')!r} is not one this tool reads "
            f"({', '.join(sorted(KNOWN_FORMATS))})",
        )
        return report
    _check_layout(raw, manifest, report)
    data = manifest.get("data")
    if not isinstance(data, dict):
        report.add(MANIFEST, "format", "no data section")
        return report
    policies = _check_policies(bundle, manifest, report)
    _check_data(bundle, manifest, data, policies, report)
    if manifest.get("format") == FORMAT:
        _check_tree(bundle, manifest, data, log_keys, later, report)
    elif later is not None or log_keys:
        report.add(
            MANIFEST,
            "tree proof",
            f"format {manifest.get('format')!r} carries no tree proof to check the log key or "
            "a later tree head against",
        )
    return report


def _check_tree(
    bundle: _Bundle,
    manifest: dict[str, Any],
    data: dict[str, Any],
    log_keys: Sequence[ed25519.Ed25519PublicKey],
    later: LaterHead | None,
    report: Report,
) -> None:
    """The signed tree head (its signature with the log key), the subset proof from the
    exported leaves to its root, and a later head's consistency with it."""
    try:
        head = merkle.TreeHead.from_json(manifest.get("tree_head"))
    except merkle.MerkleError as error:
        report.add(MANIFEST, "tree head", f"not a signed tree head ({error})")
        return
    try:
        own_key = merkle.parse_log_key({"key": manifest.get("log_key")})
    except merkle.MerkleError:
        report.add(MANIFEST, "log key", "log_key is not a base64 Ed25519 public key")
        return
    trusted = {merkle.public_key_bytes(key) for key in log_keys}
    if trusted and merkle.public_key_bytes(own_key) not in trusted:
        report.add(
            MANIFEST,
            "log key",
            "the manifest names another consent log key than "
            + ("the one given" if len(trusted) == 1 else "those given")
            + " (if the log's key changed since the export, pass the earlier key with "
            "--log-key too)",
        )
    problem = _signed_by_one(list(log_keys) or [own_key], head)
    if problem is not None:
        report.add(MANIFEST, "tree head", problem)
        return
    proof = manifest.get("tree_proof")
    name = _safe_name(proof.get("file")) if isinstance(proof, dict) else None
    if not isinstance(proof, dict) or name != PROOF_FILE:
        report.add(MANIFEST, "tree proof", f"no tree_proof naming {PROOF_FILE}")
        return
    handle = bundle.open(name)
    if handle is None:
        report.add(name, "missing", "the manifest names this proof file; it is not there")
        return
    actual = _sha256(handle)
    if actual != proof.get("sha256"):
        report.add(name, "sha256", f"SHA-256 is {actual}, the manifest says {proof.get('sha256')}")
        return
    data_name = _safe_name(data.get("file"))
    data_handle = bundle.open(data_name) if data_name else None
    if data_name is None or data_handle is None:
        return  # the data checks have named the missing file already
    proof_handle = bundle.open(name)
    assert proof_handle is not None  # read above
    with data_handle, proof_handle:
        try:
            _prove(data_name, data_handle, str(data.get("format")), proof_handle, head, report)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, csv.Error, RecursionError):
            return  # the row checks have named the unreadable line already
    if report.proven_head is not None and later is not None:
        _check_later(head, list(log_keys) or [own_key], later, report)


def _proof_hashes(handle: IO[bytes]) -> Iterator[bytes]:
    number = 0
    while line := handle.readline(2 * merkle.HASH_SIZE + 2):  # never more than a line's worth
        number += 1
        text = line.rstrip(b"\n")
        if len(text) != 2 * merkle.HASH_SIZE or text.lower() != text:
            raise _BadProofLine(number)
        try:
            yield bytes.fromhex(text.decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            raise _BadProofLine(number) from None


class _BadProofLine(Exception):
    def __init__(self, number: int) -> None:
        super().__init__(f"line {number} is not 64 lowercase hex digits")


def _prove(
    data_name: str,
    data_handle: IO[bytes],
    data_format: str,
    proof_handle: IO[bytes],
    head: merkle.TreeHead,
    report: Report,
) -> None:
    leaves = (
        (int(row["seq"]) - 1, bytes.fromhex(str(row["leaf_hash"])))
        for _, row in _rows(data_name, data_handle, data_format)
    )
    try:
        first = next(leaves, None)
        if first is None:
            if proof_handle.read(1):
                report.add(
                    PROOF_FILE, "tree proof", "the export has no events, the proof has hashes"
                )
            else:
                report.proven_head = head
            return
        merkle.verify_subset(
            itertools.chain([first], leaves),
            _proof_hashes(proof_handle),
            tree_size=head.tree_size,
            root_hash=head.root_hash,
        )
    except _BadProofLine as error:
        report.add(PROOF_FILE, "format", str(error))
        return
    except merkle.InvalidProof as error:
        report.add(
            PROOF_FILE,
            "tree proof",
            f"the exported events are not proven leaves of the tree head of size "
            f"{head.tree_size}: {error}",
        )
        return
    report.proven_head = head


def _signed_by_one(keys: Sequence[ed25519.Ed25519PublicKey], head: merkle.TreeHead) -> str | None:
    """None when one of ``keys`` signed ``head``; otherwise what is wrong."""
    problem = "no log key to check the tree head with"
    for key in keys:
        try:
            merkle.verify_tree_head(key, head)
            return None
        except merkle.InvalidTreeHead as error:
            problem = str(error)
    if len(keys) > 1:
        return "the tree head's signature verifies with none of the log keys given"
    return problem


def _check_later(
    head: merkle.TreeHead,
    keys: Sequence[ed25519.Ed25519PublicKey],
    later: LaterHead,
    report: Report,
) -> None:
    """The later head signed by one of ``keys`` (the log's key may have changed since the
    export), and consistent with the export's."""
    problem = _signed_by_one(keys, later.head)
    if problem is not None:
        if len(keys) == 1:
            problem += "; if the log's key changed since the export, pass both keys with --log-key"
        report.add("later tree head", "signature", problem)
        return
    try:
        merkle.verify_consistency(
            first=head.tree_size,
            second=later.head.tree_size,
            first_root=head.root_hash,
            second_root=later.head.root_hash,
            proof=later.proof.consistency,
        )
    except merkle.InvalidProof as error:
        report.add(
            "later tree head",
            "consistency",
            f"the log of size {later.head.tree_size} does not extend the export's head of "
            f"size {head.tree_size}: {error}",
        )
        return
    report.later_head = later.head


def _depth(document: object) -> int:
    """How deeply lists and objects nest in a parsed JSON document (without recursing)."""
    deepest, stack = 0, [(document, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in value)
    return deepest


def bundle_anchors(path: Path, public_key: PublicKey | None = None) -> dict[int, bytes]:
    """The first and last chain events a verified bundle's signed manifest names (seq → hash).

    Raises BundleError when the bundle does not verify: an anchor is only worth what its
    signature is.
    """
    report = verify_bundle(path, public_key)
    if not report.ok:
        raise BundleError(f"{path} does not verify: {report.problems[0]}")
    handle = _open_bundle(path).open(MANIFEST)
    if handle is None:  # pragma: no cover - verify_bundle has just read it
        raise BundleError(f"{path} has no {MANIFEST}")
    with handle:
        events = json.loads(handle.read()).get("events") or {}
    anchors: dict[int, bytes] = {}
    for end in ("first", "last"):
        if isinstance(events.get(end), dict) and events[end].get("hash"):
            anchors[int(events[end]["seq"])] = bytes.fromhex(events[end]["hash"])
    return anchors


def _check_signature(
    manifest: dict[str, Any], public_key: PublicKey | None, report: Report
) -> None:
    if manifest.get("signature_algorithm") != ALGORITHM:
        report.add(MANIFEST, "signature", f"the algorithm is not {ALGORITHM}")
        return
    try:
        own = PublicKey(bytes.fromhex(str(manifest.get("public_key", ""))))
        signature = bytes.fromhex(str(manifest.get("signature", "")))
        if len(own.raw) != 32 or len(signature) != 64:
            raise ValueError
    except ValueError:
        report.add(MANIFEST, "signature", "public_key or signature is not hex of the right length")
        return
    key = public_key or own
    report.key = key
    if public_key is not None and public_key.raw != own.raw:
        report.add(
            MANIFEST,
            "public key",
            f"the manifest names key {own.hex}, not the expected {public_key.hex}",
        )
    unsigned = {name: value for name, value in manifest.items() if name != "signature"}
    if not key.verify(signature, canonical(unsigned)):
        report.add(
            MANIFEST,
            "signature",
            "the signature does not verify: the manifest was changed after signing, "
            "or another key signed it",
        )


def _check_layout(raw: bytes, manifest: dict[str, Any], report: Report) -> None:
    """The exporter writes one layout only: any other byte, even spacing, is an edit."""
    expected = manifest_bytes(manifest)
    if raw == expected:
        return
    offset = next(
        (i for i, (a, b) in enumerate(zip(raw, expected, strict=False)) if a != b),
        min(len(raw), len(expected)),
    )
    line = raw.count(b"\n", 0, offset) + 1
    report.add(
        MANIFEST,
        "layout",
        f"byte {offset} (line {line}) is not what the exporter wrote there: "
        "the file was edited after export",
    )


def _check_policies(bundle: _Bundle, manifest: dict[str, Any], report: Report) -> set[str]:
    listed = manifest.get("policies")
    if not isinstance(listed, list):
        report.add(MANIFEST, "format", "no policies list")
        return set()
    versions: set[str] = set()
    for entry in listed:
        if not isinstance(entry, dict):
            report.add(MANIFEST, "format", "a policies entry is not an object")
            continue
        name = _safe_name(entry.get("file"))
        if name is None:
            report.add(MANIFEST, "policies", f"unusable file name {entry.get('file')!r}")
            continue
        versions.add(str(entry.get("version")))
        handle = bundle.open(name)
        if handle is None:
            report.add(name, "missing", "the manifest lists this policy text; it is not there")
            continue
        actual = _sha256(handle)
        if actual != entry.get("sha256"):
            report.add(
                name, "sha256", f"SHA-256 is {actual}, the manifest says {entry.get('sha256')}"
            )
    return versions


def _check_data(
    bundle: _Bundle,
    manifest: dict[str, Any],
    data: dict[str, Any],
    policies: set[str],
    report: Report,
) -> None:
    name = _safe_name(data.get("file"))
    data_format = data.get("format")
    if name is None or data_format not in ("csv", "ndjson"):
        report.add(MANIFEST, "format", "the data file or its format is missing or unusable")
        return
    if data.get("columns") != list(COLUMNS):
        report.add(MANIFEST, "format", "the data columns are not the ones this tool reads")
        return
    handle = bundle.open(name)
    if handle is None:
        report.add(name, "missing", "the manifest names this data file; it is not there")
        return
    report.data_sha256 = _sha256(handle)
    if report.data_sha256 != data.get("sha256"):
        report.add(
            name,
            "sha256",
            f"SHA-256 is {report.data_sha256}, the manifest says {data.get('sha256')}",
        )
    handle = bundle.open(name)
    assert handle is not None
    with handle:
        _check_rows(name, handle, data_format, manifest, policies, report)


def _rows(name: str, handle: IO[bytes], data_format: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row as exported) pairs; raises ValueError on a malformed line."""
    with io.TextIOWrapper(handle, encoding="utf-8", newline="") as text:
        yield from _parse(text, data_format)


# The longest line a data file may have: far above any event's (whose free text is a
# topic label and a context of a few fields), far below what would exhaust memory.
MAX_LINE = 1 << 20


def _lines(text: IO[str]) -> Iterator[str]:
    """The file's lines, each read with a bound: a line without end (a crafted zip member
    that inflates to gigabytes) is refused, not read into memory whole."""
    while line := text.readline(MAX_LINE + 1):
        if len(line) > MAX_LINE:
            raise ValueError(f"a line is longer than {MAX_LINE} characters")
        yield line


def _parse(text: IO[str], data_format: str) -> Iterator[tuple[int, dict[str, Any]]]:
    if data_format == "ndjson":
        for number, line in enumerate(_lines(text), start=1):
            if not line.strip():
                continue
            parsed = json.loads(line)
            if not isinstance(parsed, dict) or list(parsed) != list(COLUMNS):
                raise ValueError(f"line {number}: not an object with the export's columns")
            for column, found in parsed.items():
                if not _ndjson_type_ok(column, found):
                    raise ValueError(f"line {number}: {column} is not what the export writes")
            yield number, parsed
        return
    reader = csv.reader(_lines(text))
    header = next(reader, None)
    if header != list(COLUMNS):
        raise ValueError("line 1: the header is not the export's columns")
    for cells in reader:
        number = reader.line_num
        if len(cells) != len(COLUMNS):
            raise ValueError(f"line {number}: {len(cells)} cells, not {len(COLUMNS)}")
        row: dict[str, Any] = {}
        for column, cell in zip(COLUMNS, cells, strict=True):
            value: Any = restore(cell) if column in TEXT_COLUMNS else cell
            if value == "" and column in _NULLABLE:
                value = None
            row[column] = value
        row["seq"] = int(row["seq"])
        row["topic_id"] = int(row["topic_id"]) if row["topic_id"] is not None else None
        yield number, row


# An NDJSON line's values have the types the exporter writes, so a crafted line (a seq of
# 1e999, a subscriber id that is a number) is refused as unreadable, not met by a
# traceback further on. The chain's two hashes are null for events written into the tree.
_NDJSON_NULLABLE = _NULLABLE | {"prev_hash", "hash"}
_NDJSON_INTEGERS = frozenset({"seq", "topic_id"})


def _ndjson_type_ok(column: str, value: object) -> bool:
    if value is None:
        return column in _NDJSON_NULLABLE
    if column in _NDJSON_INTEGERS:
        return type(value) is int and value >= (1 if column == "seq" else 0)
    return isinstance(value, str)


def _fields(row: dict[str, Any]) -> dict[str, Any]:
    return event_fields(
        seq=row["seq"],
        subscriber_id=uuid.UUID(row["subscriber_id"]),
        subscription_id=uuid.UUID(row["subscription_id"]) if row["subscription_id"] else None,
        topic_id=row["topic_id"],
        kind=row["kind"],
        previous_state=row["previous_state"],
        new_state=row["new_state"],
        source=row["source"],
        policy_version=row["policy_version"],
        decided_at=dt.datetime.fromisoformat(row["decided_at"]),
        recorded_at=dt.datetime.fromisoformat(row["recorded_at"]),
        actor=row["actor"],
        context=row["context"],
    )


def _event_hash(row: dict[str, Any]) -> bytes:
    """The hash chain's hash of an event written before the tree (migration 0018)."""
    return chain_hash(bytes.fromhex(row["prev_hash"]), _fields(row))


def _leaf_hash(row: dict[str, Any]) -> bytes:
    """The event's RFC 9162 leaf hash in the consent log's tree."""
    return merkle.leaf_hash(event_canonical(_fields(row)))


@dataclass
class _RowState:
    count: int = 0
    first: dict[str, Any] | None = None
    previous: dict[str, Any] | None = None
    shown: int = 0
    hidden: int = 0
    tree_size: int | None = None  # the manifest's signed tree head's


def _check_rows(
    name: str,
    handle: IO[bytes],
    data_format: str,
    manifest: dict[str, Any],
    policies: set[str],
    report: Report,
) -> None:
    state = _RowState()
    head = manifest.get("tree_head")
    if isinstance(head, dict) and isinstance(head.get("tree_size"), int):
        state.tree_size = head["tree_size"]
    filters = manifest.get("filters") if isinstance(manifest.get("filters"), dict) else {}
    assert isinstance(filters, dict)

    def problem(check: str, message: str) -> None:
        if state.shown < _ROW_PROBLEMS_SHOWN:
            report.add(name, check, message)
            state.shown += 1
        else:
            state.hidden += 1

    try:
        for number, row in _rows(name, handle, data_format):
            state.count += 1
            _check_row(number, row, state, filters, policies, problem)
            if state.first is None:
                state.first = row
            state.previous = row
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, csv.Error) as error:
        report.add(name, "format", f"cannot be read past row {state.count}: {error}")
        return
    except RecursionError:  # a line of nested brackets
        report.add(name, "format", f"cannot be read past row {state.count}: nested too deeply")
        return
    finally:
        if state.hidden:
            report.add(name, "more", f"{state.hidden} more row problems not listed")
    report.rows = state.count
    if state.count != manifest["data"].get("rows"):
        report.add(
            name,
            "row count",
            f"{state.count} rows, the manifest says {manifest['data'].get('rows')}",
        )
    events = manifest.get("events") if isinstance(manifest.get("events"), dict) else {}
    assert isinstance(events, dict)
    for end, found in (("first", state.first), ("last", state.previous)):
        expected = events.get(end)
        actual = {"seq": found["seq"], "hash": found["leaf_hash"]} if found else None
        if expected != actual:
            report.add(name, f"{end} event", f"the data has {actual}, the manifest says {expected}")


def _check_row(
    number: int,
    row: dict[str, Any],
    state: _RowState,
    filters: dict[str, Any],
    policies: set[str],
    problem: Any,
) -> None:
    where = f"line {number} (seq {row['seq']})"
    previous = state.previous
    if previous is not None and row["seq"] <= previous["seq"]:
        problem("order", f"{where}: does not come after seq {previous['seq']}")
    # Every event is a leaf of the log's tree: its leaf hash covers its content. The
    # events written before the tree (migration 0018) also carry their hash chain.
    chained = bool(row["hash"]) or bool(row["prev_hash"])
    try:
        matches = _leaf_hash(row).hex() == row["leaf_hash"] and (
            not chained or _event_hash(row).hex() == row["hash"]
        )
    except (ValueError, TypeError, OverflowError) as error:
        # OverflowError: a time at the edge of the calendar whose UTC form is past it.
        problem("event hash", f"{where}: a value cannot be read ({error})")
        matches = True
    if not matches:
        problem("event hash", f"{where}: the hash does not match the event's content")
    head = state.tree_size
    if head is not None and row["seq"] > head:
        problem("tree head", f"{where}: is not in the tree head of size {head}")
    if (
        chained
        and previous is not None
        and row["seq"] == previous["seq"] + 1
        and row["prev_hash"] != previous["hash"]
    ):
        problem("chain", f"{where}: prev_hash is not the hash of seq {previous['seq']}")
    if row["policy_version"] is not None and row["policy_version"] not in policies:
        problem("policies", f"{where}: policy version {row['policy_version']} has no text here")
    recorded = row["recorded_at"]
    low, high = filters.get("recorded_at_from"), filters.get("recorded_at_before")
    if isinstance(low, str) and isinstance(high, str) and not low <= recorded < high:
        problem("filters", f"{where}: recorded_at {recorded} is outside {low} – {high}")
    if filters.get("topic") and row["topic_slug"] != filters["topic"]:
        problem("filters", f"{where}: topic {row['topic_slug']} is not {filters['topic']}")
    if filters.get("subscriber") and row["subscriber_id"] != filters["subscriber"]:
        problem("filters", f"{where}: another subscriber")
