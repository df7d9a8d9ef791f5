"""Pricing: rating usage with price books, billing periods, budgets, unbilled usage."""
