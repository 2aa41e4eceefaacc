"""The public pages and the service worker script, as served."""

from __future__ import annotations

import re

import pytest

from portal.seams import current_portal
from tests.conftest import VAPID_PUBLIC


def test_the_service_worker_is_served_from_the_root_uncached(client):
    response = client.get("/sw.js")
    body = response.get_data()
    response.close()  # the file it streams from
    assert response.status_code == 200
    assert response.mimetype == "text/javascript"
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.headers["Service-Worker-Allowed"] == "/"
    assert b'addEventListener("push"' in body


def test_the_service_worker_knows_the_sites_campaigns_may_link_to(app, client):
    first = client.get("/sw.js")
    default = first.get_data(as_text=True)
    assert "\nvar LINK_ORIGINS = [];\n" in default  # this site only
    current_portal(app).settings = current_portal(app).settings.with_overrides(
        campaign_link_origins=("https://shop.example", "https://cdn.example")
    )
    served = client.get("/sw.js")
    text = served.get_data(as_text=True)
    assert '\nvar LINK_ORIGINS = ["https://shop.example", "https://cdn.example"];\n' in text
    assert text.count("LINK_ORIGINS") == default.count("LINK_ORIGINS")
    # A browser revalidates the worker cheaply, and sees a change of the list at once.
    assert served.headers["ETag"] != first.headers["ETag"]
    again = client.get("/sw.js", headers={"If-None-Match": served.headers["ETag"]})
    assert again.status_code == 304


def test_the_vapid_public_key_is_published_for_the_service_worker(client):
    response = client.get("/api/push/vapid-public-key")
    assert response.status_code == 200
    assert response.json == {"publicKey": VAPID_PUBLIC}


@pytest.mark.usefixtures("catalogue_ready")
def test_the_subscribe_page_carries_its_data_without_inline_script_or_style(client):
    html = client.get("/").text
    assert f'data-vapid-public-key="{VAPID_PUBLIC}"' in html
    assert 'data-policy-version="v1"' in html
    # The notice the choices are made under, in full, beside the version submitted.
    assert "We send what you choose." in html
    assert 'href="/policy/v1"' in html
    assert 'name="csrf-token"' in html
    # Marketing topics are offered; transactional ones are only described.
    assert 'id="topic-weekly-digest"' in html
    assert 'id="topic-offers"' in html
    assert 'id="topic-security-alerts"' not in html
    assert "Security Alerts" in html
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)
    assert " style=" not in html
    assert "<style" not in html
    assert " on" + "click=" not in html
