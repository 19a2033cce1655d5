"""The pages' process-wide caches, keyed by their inputs (``st.cache_resource`` and bounded stores).

- ``explore_heads``, ``scaling``, ``flash``, ``generation``, ``importance``, ``queries_keys``: one page's caches each
- ``store``: the one bounded least-recently-used store and the one file stamp the caches are built from
- ``shared_measurements``: the Flash page's timings, measured once per server and shared by every session
"""
