"""Framework integrations; each module imports its framework only when used."""
