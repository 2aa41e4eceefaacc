"""Test devices: browsers a member of staff registered to receive campaign tests.

A test device is staff-owned, not a subscriber: it has no subscriber, no topic
preference and no consent event, so no audience query, count, consent log or export ever
meets it, and a test sent to it is no delivery (no ``delivery`` row, no campaign row;
nothing is marked sent). Its credentials are kept as ``push_subscription`` keeps them:
the endpoint as the browser gave it (canonical), its SHA-256 for uniqueness, the
p256dh key, and the auth secret sealed with the subscription key ring.

Who may use which: a device belongs to the member of staff who registered it, and only
they see it, rename it, remove it or send tests to it; no role reaches another person's
devices (the queries below always name the owner). Registering and sending need the
``campaigns`` role (the views check it).

A test send goes out in the request, to at most :data:`MAX_DEVICES_PER_SEND` devices at
once, so the page can say what each push service answered: ``sent`` (accepted), ``gone``
(404 or 410: the device is marked gone and cannot be chosen again until the browser is
registered again) or ``error`` (any other answer, a network error, unreadable keys). A
member of staff may send :data:`SENDS_PER_WINDOW` tests in any :data:`SEND_WINDOW`.
"""

from __future__ import annotations

import datetime as dt
import threading
import unicodedata
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from portal.campaigns.models import Campaign
from portal.campaigns.services import device_payload
from portal.campaigns.testdevice_models import MAX_NAME, TestDevice, TestSend
from portal.config import b64url_decode
from portal.errors import ApiError, ValidationError
from portal.push.transport import PushRequest, PushResponse, Urgency
from portal.seams import current_portal
from portal.subscriptions.sealing import KeyRing
from portal.subscriptions.validation import ValidSubscription

if TYPE_CHECKING:
    from portal.push.transport import PushTransport

MAX_DEVICES_PER_STAFF = 20
MAX_DEVICES_PER_SEND = 10
SENDS_PER_WINDOW = 10
SEND_WINDOW = dt.timedelta(minutes=10)
# A test send's answer page lasts this long; older ones of the same person are deleted
# when they send the next (the audit trail keeps what was sent to which device).
SEND_KEPT = dt.timedelta(days=30)

# The largest id the column holds (a 32-bit INTEGER): a larger number names no device.
MAX_ID = 2**31 - 1

SENT, GONE, ERROR = "sent", "gone", "error"
RESULT_LABELS = {SENT: "Sent", GONE: "Gone", ERROR: "Error"}


# -- names --------------------------------------------------------------------------------


def name_key(name: str) -> str:
    return unicodedata.normalize("NFKC", name).casefold().strip()


def clean_name(text: str | None) -> str:
    """A device's name as typed, checked: 1 to MAX_NAME printable characters."""
    name = " ".join((text or "").split())
    if not name:
        raise ValidationError("missing_field", "Enter a name for this device", "name")
    if len(name) > MAX_NAME:
        raise ValidationError(
            "too_long", f"The name must be {MAX_NAME} characters or fewer", "name"
        )
    if any(unicodedata.category(c) in {"Cc", "Cf", "Cs", "Co", "Cn"} for c in name):
        raise ValidationError(
            "invalid_value", "The name has a character that cannot be shown", "name"
        )
    return name


def _taken(name: str) -> ValidationError:
    return ValidationError(
        "name_taken", f"You have a test device named “{name}” already: choose another name", "name"
    )


def _name_taken(
    session: Session, staff_id: uuid.UUID, name: str, *, other_than: int | None = None
) -> TestDevice | None:
    query = sa.select(TestDevice).where(
        TestDevice.staff_user_id == staff_id, TestDevice.name_key == name_key(name)
    )
    if other_than is not None:
        query = query.where(TestDevice.id != other_than)
    return session.scalars(query).first()


# -- a person's devices -------------------------------------------------------------------


def devices_of(session: Session, staff_id: uuid.UUID) -> list[TestDevice]:
    """Someone's devices, oldest first."""
    return list(
        session.scalars(
            sa.select(TestDevice)
            .where(TestDevice.staff_user_id == staff_id)
            .order_by(TestDevice.created_at, TestDevice.id)
        )
    )


def own_device(session: Session, staff_id: uuid.UUID, device_id: int) -> TestDevice | None:
    """The device when it is this person's; None for anyone else's and for no device."""
    if not 1 <= device_id <= MAX_ID:
        return None
    return session.scalars(
        sa.select(TestDevice).where(
            TestDevice.id == device_id, TestDevice.staff_user_id == staff_id
        )
    ).first()


@dataclass(frozen=True)
class Registered:
    device: TestDevice
    created: bool


def register(
    session: Session,
    staff_id: uuid.UUID,
    name_text: str | None,
    subscription: ValidSubscription,
    *,
    user_agent: str | None,
    keys: KeyRing,
    now: dt.datetime,
) -> Registered:
    """Register this browser's push subscription as one of ``staff_id``'s test devices.

    The same browser registered again (the same endpoint) keeps its row and name, and
    takes the keys it sent now; a gone device comes back."""
    digest = subscription.endpoint.hash
    sealed = keys.seal(subscription.auth)
    existing = session.scalars(
        sa.select(TestDevice).where(
            TestDevice.staff_user_id == staff_id, TestDevice.endpoint_hash == digest
        )
    ).first()
    if existing is not None:
        existing.p256dh = subscription.p256dh
        existing.auth_sealed = sealed.sealed
        existing.auth_key_version = sealed.key_version
        existing.gone_at = None
        session.flush()
        return Registered(existing, created=False)
    name = clean_name(name_text)
    if _name_taken(session, staff_id, name) is not None:
        raise ValidationError(
            "name_taken",
            f"You have a test device named “{name}” already: choose another name",
            "name",
        )
    count = session.scalar(
        sa.select(sa.func.count())
        .select_from(TestDevice)
        .where(TestDevice.staff_user_id == staff_id)
    )
    if (count or 0) >= MAX_DEVICES_PER_STAFF:
        raise ValidationError(
            "too_many_devices",
            f"You have {MAX_DEVICES_PER_STAFF} test devices: remove one before adding another",
            "name",
        )
    device = TestDevice(
        staff_user_id=staff_id,
        name=name,
        name_key=name_key(name),
        endpoint=subscription.endpoint.endpoint,
        endpoint_hash=digest,
        push_service=subscription.endpoint.push_service.value,
        p256dh=subscription.p256dh,
        auth_sealed=sealed.sealed,
        auth_key_version=sealed.key_version,
        user_agent=(user_agent or "")[:400] or None,
        created_at=now,
    )
    session.add(device)
    session.flush()
    return Registered(device, created=True)


def rename(session: Session, device: TestDevice, name_text: str | None) -> str:
    """Rename; answers the old name."""
    name = clean_name(name_text)
    if _name_taken(session, device.staff_user_id, name, other_than=device.id) is not None:
        raise ValidationError(
            "name_taken",
            f"You have a test device named “{name}” already: choose another name",
            "name",
        )
    old = device.name
    device.name = name
    device.name_key = name_key(name)
    session.flush()
    return old


# -- choosing devices for a test ----------------------------------------------------------


class DeviceChoiceError(ApiError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message, "device", status=422)


def parse_choice(values: Iterable[str]) -> list[int]:
    """The ``device`` values of a form: whole positive numbers, each once, in order."""
    chosen: list[int] = []
    for value in values:
        text = value.strip()
        # The length first: leading zeros would carry a number past MAX_ID into the
        # query (a database error), and thousands of digits past int()'s own limit.
        if (
            not text.isascii()
            or not text.isdigit()
            or len(text) > len(str(MAX_ID))
            or not 1 <= int(text) <= MAX_ID
        ):
            raise DeviceChoiceError(
                "invalid_device", "A device in the choice is not a device number"
            )
        number = int(text)
        if number not in chosen:
            chosen.append(number)
    if not chosen:
        raise DeviceChoiceError("no_device", "Choose at least one test device")
    if len(chosen) > MAX_DEVICES_PER_SEND:
        raise DeviceChoiceError(
            "too_many_devices", f"Choose at most {MAX_DEVICES_PER_SEND} test devices at once"
        )
    return chosen


def chosen_devices(session: Session, staff_id: uuid.UUID, ids: list[int]) -> list[TestDevice]:
    """The devices named, when every one is this person's and not gone."""
    found = {
        d.id: d
        for d in session.scalars(
            sa.select(TestDevice).where(
                TestDevice.id.in_(ids), TestDevice.staff_user_id == staff_id
            )
        )
    }
    if len(found) != len(ids):
        raise DeviceChoiceError(
            "unknown_device", "Choose among your own test devices: one of those is not yours"
        )
    gone = [found[i].name for i in ids if found[i].is_gone]
    if gone:
        raise DeviceChoiceError(
            "device_gone",
            f"“{gone[0]}” is gone (its push service no longer knows it): register that "
            "browser again, or choose another device",
        )
    return [found[i] for i in ids]


def next_send_allowed(
    session: Session, staff_id: uuid.UUID, now: dt.datetime
) -> dt.datetime | None:
    """None when this person may send a test now, else when they may."""
    since = now - SEND_WINDOW
    times = list(
        session.scalars(
            sa.select(TestSend.sent_at)
            .where(TestSend.staff_user_id == staff_id, TestSend.sent_at > since)
            .order_by(TestSend.sent_at)
        )
    )
    if len(times) < SENDS_PER_WINDOW:
        return None
    return times[len(times) - SENDS_PER_WINDOW] + SEND_WINDOW


def record_send(
    session: Session,
    staff_id: uuid.UUID,
    fields: dict[str, Any],
    outcomes: list[dict[str, Any]],
    *,
    now: dt.datetime,
) -> TestSend:
    """Keep a send's form and outcomes (its answer page), and let go of this person's
    sends older than SEND_KEPT."""
    session.execute(
        sa.delete(TestSend).where(
            TestSend.staff_user_id == staff_id, TestSend.sent_at < now - SEND_KEPT
        )
    )
    sent = TestSend(staff_user_id=staff_id, sent_at=now, fields=fields, outcomes=outcomes)
    session.add(sent)
    session.flush()
    return sent


# -- sending ------------------------------------------------------------------------------

_lock = threading.Lock()
_transports: WeakKeyDictionary[Flask, PushTransport] = WeakKeyDictionary()


def transport_for(app: Flask) -> PushTransport:
    """This process's transport for test sends, made on first use from the app's
    transport factory: a test never waits for the dispatcher's batch to finish."""
    with _lock:
        existing = _transports.get(app)
        if existing is None:
            portal = current_portal(app)
            existing = portal.transport_factory(portal)
            _transports[app] = existing
        return existing


def _detail(response: PushResponse) -> tuple[str, str]:
    status = response.status
    if response.accepted:
        return SENT, f"Accepted by the push service ({status})"
    if status in {404, 410}:
        return GONE, (
            f"The push service no longer knows this browser ({status}): "
            "register it again on the Test devices page"
        )
    if status is None:
        return ERROR, f"No answer from the push service: {response.error or 'network error'}"
    if status == 429:
        return ERROR, "The push service asked us to slow down (429): try again in a minute"
    return ERROR, f"The push service refused the message ({status})"


def send_test(
    session: Session,
    devices: list[TestDevice],
    campaign: Campaign,
    *,
    keys: KeyRing,
    transport: PushTransport,
    now: dt.datetime,
) -> list[dict[str, Any]]:
    """Send ``campaign``'s message to each device at once; record each device's answer
    (a 404 or 410 marks it gone) and return the outcomes, in the devices' order."""
    plaintext = device_payload(campaign)
    urgency = Urgency(campaign.urgency)
    outcomes: dict[int, dict[str, Any]] = {}
    requests: list[PushRequest] = []
    sent: list[TestDevice] = []
    for device in devices:
        try:
            secret = keys.open(bytes(device.auth_sealed), device.auth_key_version)
            requests.append(
                PushRequest.encrypted(
                    device.endpoint,
                    plaintext,
                    p256dh=b64url_decode(device.p256dh),
                    auth=secret,
                    ttl=campaign.ttl,
                    urgency=urgency,
                    topic=campaign.collapse_key,
                )
            )
        except Exception:  # this device's keys or endpoint: it alone fails
            outcomes[device.id] = {
                "result": ERROR,
                "detail": (
                    "This device's keys could not be used: remove it and register the browser again"
                ),
                "status": None,
            }
            continue
        sent.append(device)
    responses = transport.send_batch(requests) if requests else []
    for device, response in zip(sent, responses, strict=True):
        result, detail = _detail(response)
        outcomes[device.id] = {"result": result, "detail": detail, "status": response.status}
    rows = []
    for device in devices:
        outcome = outcomes[device.id]
        device.last_tested_at = now
        device.last_result = outcome["result"]
        device.last_status = outcome["status"]
        if outcome["result"] == GONE:
            device.gone_at = now
        rows.append({"device": device.id, "name": device.name, **outcome})
    session.flush()
    return rows
