"""Payments: Stripe (the only importer of `stripe`), invoice sync, webhook events."""
