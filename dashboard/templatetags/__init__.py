"""Template filters only the dashboard's pages use."""
