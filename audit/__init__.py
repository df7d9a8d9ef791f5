"""The audit trail: every change to what finance staff and tenants' admins
manage (prices, cost rates, budgets and policies, credit grants, invoices
and credit notes, API keys, memberships, the fleet's cost facts), recorded
by PostgreSQL triggers into one append-only table, with who made it, from
where, and the row before and after. Writes that bypass the ORM (a psql
session, a raw UPDATE) are recorded too; the database refuses any UPDATE,
DELETE or TRUNCATE of an entry."""
