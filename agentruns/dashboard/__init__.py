"""The operations dashboard in the admin (``/admin/agentruns/agentrun/dashboard/``): charts for
staff who would rather look than read (README "The dashboard", docs/design.md §11.3).

``series`` reads (one aggregate query per chart over a bounded window), ``svg`` draws
(pygal, server-side, no JavaScript, nothing fetched from elsewhere), ``charts`` lists the charts
(``CHARTS``: each one small function, query → series) and ``views`` renders the page. It only
reads: it never writes a run, an event or a counter.
"""
