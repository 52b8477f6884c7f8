"""The dashboard's rows, one module each: a module's ROW is its row."""
