"""The developer pages and the sample tools over ``Note``.

It registers its tools with ``agentruns`` in ``AppConfig.ready()`` and calls ``agentruns``
services; ``agentruns`` never imports it.
"""
