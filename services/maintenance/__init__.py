"""Keeping the graph clean over months (issue 21; docs/curation.md): review of entity links
today; consolidation, pruning and curations to come."""
