"""The plan's REST API: serializers, and views that call planning's
services and selectors."""
