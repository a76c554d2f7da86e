"""Shared by every test tier: pytest puts this folder on sys.path (it holds a conftest.py and
no __init__.py), so the unit and e2e tiers import ``time_bounds`` from here."""
