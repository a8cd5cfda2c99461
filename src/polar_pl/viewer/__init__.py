"""`polar-pl view`: a local web page over a trace store and run directories (read-only)."""
