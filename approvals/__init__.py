"""The staff inbox inside the Django admin: approve or deny pending writes, supply input,
reconcile in-doubt runs, read timelines.

It calls ``agentruns`` services and selectors and never writes a run itself.
"""
