"""What runs inside a sandboxed child: the zygote (a forkserver), the harness that builds a candidate's model,
the request loop, the arena writer, the in-process guard, kernel coverage and what the kernels wrote.

The parent never imports these: it starts the zygote by its module name (children.py) and talks to it
through the shared protocol (protocol.py, wire.py). These import only each other and the shared modules
named in tests/house/test_layers.py (CHILD_SHARED), nothing of the parent's side."""
