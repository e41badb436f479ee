"""Shared fixtures live in one module per area, each loaded as a plugin."""

pytest_plugins = ["fixtures_s3", "fixtures_stores", "fixtures_corpus", "fixtures_tmp"]
