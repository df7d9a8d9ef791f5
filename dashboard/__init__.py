"""Platform pages that read across apps: the health check, /metrics, the
scheduled jobs page and the site's error pages."""
