"""Where device readings come from: local JAX devices, replay files, the spool, and the fault-injecting wrapper."""
