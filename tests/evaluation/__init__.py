"""The scoring pipeline compare() and GAECallback share."""
