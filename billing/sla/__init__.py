"""Service levels: which SLO policy applies to a tenant (policies), its
compliance per day and per period measured from the ledger and the SLA
credit a missed period earns (compliance), and what the finance and
tenant pages and the API read of it (selectors). The credit's invoice
line is invoicing's (billing.invoicing.sla_credits)."""
