"""The generators of the deployment files that must agree with a single source (deploy/generate.py runs them)."""
