"""Invoicing: drafts, finalizing and numbering, lines, runs, late usage, credits, credit notes."""
