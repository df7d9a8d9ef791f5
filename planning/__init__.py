"""Planning: from the ledger to next month (issue 46): demand forecasts
per pool and model, and what follows from them."""
