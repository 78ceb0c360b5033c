"""The request protocol's parts that stand on their own: what a structured output asks
for (``structured``), and tool calls (``tools``)."""
