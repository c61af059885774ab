"""One GraphQL type per module."""
