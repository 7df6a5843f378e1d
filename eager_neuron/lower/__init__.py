"""Lowerings: turn one aten call on host-backed device buffers into kernel launches.

Each module owns one kernel family and exposes `LOWERINGS: {"aten::op.overload": fn}`; the table
in `eager_neuron.ops` says which op goes where. A lowering gets `(func, a, outs)` where `a` maps
schema argument names to values (device tensors unwrapped to their host-backed buffers) and
`outs` are the preallocated outputs it must fill.
"""
