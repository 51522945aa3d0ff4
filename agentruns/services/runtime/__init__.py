"""The runtime: one segment of a run, from its last step boundary to a pause or an end.

Import what you need from its modules; this package imports none of them, so that an interface
may use ``results`` (``Outcome``, ``SegmentResult``) without importing the loop.
"""
