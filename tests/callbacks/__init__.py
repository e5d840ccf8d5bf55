"""GAECallback, one module per concern."""
