"""Readers of what XLA writes: a compiled program's HLO text and a trace's `.xplane.pb`, as plain data.

Pure modules on text and bytes: they import neither JAX nor protobuf nor any other jaxmon package, so any jaxmon
process can load them and they run off the training thread. The tracker (jaxmon.training) hands them what JAX
gave it and keeps what they return.

- `hlo`: a program's collectives from its optimized HLO text (`Compiled.as_text()`): op, bytes, groups, how often
  each runs, and the user's mesh axes they span; `hlo_groups` reads the spellings of shapes and groups;
- `xspace`: a reader of the serialized XSpace protobuf (tsl's xplane.proto, field numbers in its docstring), on
  the wire format of `wire`;
- `classify`: which events are compute, collectives (and which kind) or copies, on which local device, per
  platform (CPU, GPU, TPU layouts); `copies`: a copy's direction and bytes where the trace says them;
- `intervals`: unions of intervals and the precedence split (compute, exposed collective, copy, idle);
- `profile`: `read(bytes) -> Trace`, then `Trace.split(t0_ns, t1_ns)` per device.

This package's `__init__` imports nothing: importing one reader loads that reader and what it needs, no more.
"""
