"""Model loaders: turn a public model id into a resident, callable model."""
