"""Spend control: what a tenant may still spend and how the gateway holds
it to that. Accounts and slices (the gateway's exact, concurrent counts in
Redis or in process), terms (each tenant's limits, prices and credit at a
moment), the prepaid wallet, the ledger's corrections of the gateway's
counts, balances, budgets and their API. Below invoicing: an invoice run
reads the wallet, spend control never reads an invoice run."""
