"""The service end to end: on the session's stack of real processes (API, control and
model workers) with the real models, or on stacks of their own that tests kill and
restart. Run in a pytest process of their own (``make test``)."""
