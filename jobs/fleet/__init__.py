"""The model fleet: what can be served and where. A data team's own model folder is
checked here before anything of it is published (``folders``: a local directory or an
object-store prefix holding a transformers model the chosen kind's engine can load),
and a version nothing is pinned to is retired here (``retire``)."""
