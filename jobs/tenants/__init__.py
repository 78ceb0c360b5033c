"""Projects (tenants), their service accounts and API keys, rate limits, usage and costs."""
