"""Test helpers shared across test folders (servers, fixtures)."""
