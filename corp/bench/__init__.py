"""Compute accounting and (later) the matched-compute benchmark sweep."""
