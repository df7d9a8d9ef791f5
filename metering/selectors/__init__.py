"""Reads of metering's tables, one module per subject: usage (a tenant's
usage from the hourly rollups), totals (every tenant's sums for
allocation and reports), rating (the sums rating prices, by stretch of
unchanging prices), queue (the gateway's queue by tier), requests (one
request from the ledger), reconciliation (the ledger against vLLM's own
counters) and slo (percentiles over the ledger). Callers import the
subject's module."""
