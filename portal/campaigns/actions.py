"""Audit action names for campaigns, registered for the audit page's filter."""

from __future__ import annotations

from portal.staff import audit

LAUNCHED = "campaign.launched"
TEST_SENT = "campaign.test_sent"
PAUSED = "campaign.paused"
RESUMED = "campaign.resumed"
CANCELLED = "campaign.cancelled"
DRAFT_SAVED = "campaign.draft_saved"
DRAFT_CHANGED = "campaign.draft_changed"
CLONED = "campaign.cloned"
DEVICE_TEST_SENT = "campaign.device_test_sent"
DEVICE_REGISTERED = "test_device.registered"
DEVICE_RENAMED = "test_device.renamed"
DEVICE_REMOVED = "test_device.removed"
PICTURE_UPLOADED = "campaign.picture_uploaded"

audit.register_action(LAUNCHED, "Campaign launched")  # created and launched at once
audit.register_action(TEST_SENT, "Campaign test sent")
audit.register_action(PAUSED, "Campaign paused")
audit.register_action(RESUMED, "Campaign resumed")
audit.register_action(CANCELLED, "Campaign cancelled")
audit.register_action(DRAFT_SAVED, "Campaign draft saved")
audit.register_action(DRAFT_CHANGED, "Campaign draft changed")
audit.register_action(CLONED, "Campaign cloned into a draft")
audit.register_action(DEVICE_TEST_SENT, "Campaign test sent to test devices")
audit.register_action(DEVICE_REGISTERED, "Test device registered")
audit.register_action(DEVICE_RENAMED, "Test device renamed")
audit.register_action(DEVICE_REMOVED, "Test device removed")
audit.register_action(PICTURE_UPLOADED, "Campaign picture uploaded")
