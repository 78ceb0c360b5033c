"""The request protocol, shared by the API, batch validation and the workers: the
request bodies and how they are parsed (``endpoints``, ``validation``, ``embeddings``,
``generation``, ``responses_request``, ``batch``, ``parameters``, ``parsing``), what a
structured output asks for (``structured``), tool calls (``tools``, ``tool_use``,
``tool_calls``), and the answers' shapes (``shapes``, ``responses``)."""
