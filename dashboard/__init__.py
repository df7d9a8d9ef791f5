"""The web app: every server-rendered page (finance, invoices, the tenant
portal, request traces, API keys, jobs), the health check, /metrics and the
site's error pages. It sits above billing and metering and reads through
their selectors."""
