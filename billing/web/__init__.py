"""Billing's dashboard pages (finance staff and tenants)."""
