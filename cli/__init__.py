"""The ``inferq`` command line and the process supervisor behind ``inferq up``.

Not HTTP code: the CLI talks to the API as a client (the openai SDK) and runs
the service's processes (``cli.stack``)."""
