"""Executing runs: the executor (claims, leases, cancels, delegation) and its process."""
