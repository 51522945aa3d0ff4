"""A minimal Django project with Leasehold added: the contrib apps, django-q2, ``agentruns``
and ``approvals`` only (no ``AGENTRUNS`` setting, no DRF, no playground, no templates dir).

``tests/test_reusable_apps.py`` runs ``scenario`` against it in a fresh process.
"""
