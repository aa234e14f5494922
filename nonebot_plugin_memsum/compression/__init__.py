"""The compression engine: a pure core (budget, units, templates, requests, parsing,
trigger) and the service around it."""
