"""inferq's domain: settings, schema, lifecycle, use cases. No Flask, no torch."""
