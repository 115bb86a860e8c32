"""pbgio."""
