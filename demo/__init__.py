"""The roof: the main job (`manage.py up`), the demo stack it starts, the
demo world's seeds and its synthetic history. Imports every app; no app
imports it."""
