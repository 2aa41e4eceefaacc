"""Deliveries of campaigns to subscriptions, and what browsers report about them."""
