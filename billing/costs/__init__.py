"""Cost: rates, the cost model, allocation and its runs, scenarios, checks, reads."""
