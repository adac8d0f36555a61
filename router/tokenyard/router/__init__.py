"""tokenyard's request router: picks the engine replica that will return a request's first token soonest.

The decision core (``core``, ``framework``, ``plugins``, ``prefix``, ``accounting``, ``discovery``,
``enginestats``) is pure: plain data in, a plain decision out, time passed in. The adapters (``http_front``,
``grpc_front``, ``proxy``, ``shared``, ``kube``, ``scrape``) do the I/O around it.
"""
