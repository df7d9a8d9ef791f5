"""The demo world's seeds: tenants and users, the fleet, cost rates, prices and FX rates."""
